"""Running one DVC stage in a subprocess (`dvc repro --single-item <stage>`) and reading what DVC did.

Prefect-free, so the flows stay thin and this part is testable on its own.
"""
from __future__ import annotations

import collections
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from components import lifeline
from components.environ import snapshot as environ_snapshot
from components.redact import redact_url

TAIL_LINES = 40
USER_ERROR_MARK = ": error: "  # how `star` prints a UserError: retrying will not fix it


@dataclass(frozen=True)
class StageOutcome:
    """What happened to a stage: `ran`, `unchanged` (up to date), or `restored` (from DVC's run cache)."""

    stage: str
    status: str
    seconds: float
    started: float
    finished: float
    devices: tuple[str, ...] = ()


class StageFailed(RuntimeError):
    """A stage's command failed; the message carries the tail of its log."""

    def __init__(self, stage: str, returncode: int, tail: str):
        self.stage, self.returncode, self.tail = stage, returncode, tail
        super().__init__(f"stage '{stage}' failed (exit code {returncode}); last lines of its log:\n{tail}")

    @property
    def transient(self) -> bool:
        """False when the stage reported a user error (bad params, missing file): retrying cannot help."""
        return USER_ERROR_MARK not in self.tail and "ParamsError" not in self.tail


def dvc_executable() -> str:
    """The `dvc` next to this Python (the project's venv), else the one on PATH."""
    candidate = Path(sys.executable).parent / "dvc"
    return str(candidate) if candidate.exists() else "dvc"


def stage_environment(extra: Mapping[str, str]) -> dict[str, str]:
    """The environment of a stage process: ours, plus `extra`, with this venv's bin first on PATH (for `star`)."""
    env = environ_snapshot()
    env.update(extra)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env.setdefault("DVC_NO_ANALYTICS", "1")
    return env


def repro_command(stage: str, force: bool = False) -> list[str]:
    """`dvc repro` of exactly one stage (Prefect has already run its upstream stages)."""
    command = [dvc_executable(), "--wait-for-lock", "repro", "--single-item", stage]
    return command + (["--force"] if force else [])


def classify(stage: str, log: str) -> str:
    """Read DVC's log: did the stage run, was it up to date, or was it restored from the run cache?"""
    if f"Stage '{stage}' is cached" in log or "Restored stage" in log:
        return "restored"
    if f"Stage '{stage}' didn't change" in log:
        return "unchanged"
    return "ran"


def run_stage(stage: str, root: str | Path, env: Mapping[str, str], force: bool = False,
              on_line: Callable[[str], None] | None = None, devices: tuple[str, ...] = ()) -> StageOutcome:
    """Reproduce one stage; stream its log to `on_line`; raise StageFailed with the log tail on failure. URL
    passwords and tokens in the log (a traceback quoting an endpoint) are masked before they go anywhere.

    `dvc repro` is tied to this process (`lifeline.tied`): killing `star run`, even with SIGKILL, stops it and the
    stage under it instead of leaving them to finish beside a rerun."""
    started = time.time()
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    lines: list[str] = []
    with lifeline.tied(repro_command(stage, force), cwd=root, env=stage_environment(env), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, errors="replace") as process:
        assert process.stdout is not None
        for line in process.stdout:
            line = redact_url(line.rstrip("\n"))
            tail.append(line)
            if len(lines) < 200:  # DVC's own status lines come first
                lines.append(line)
            if on_line:
                on_line(line)
        returncode = process.wait()
    finished = time.time()
    if returncode != 0:
        raise StageFailed(stage, returncode, "\n".join(tail))
    return StageOutcome(stage, classify(stage, "\n".join(lines)), finished - started, started, finished, devices)
