"""Stopping `star run` stops everything it started: its `dvc repro` and the stage under it, even after a SIGKILL."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from components import lifeline
from test_lifeline import descendants, open_for_writing_once_read

from .test_ui import gone_within, kill_all, live_processes_with

BIN = Path(sys.executable).parent
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")]


@pytest.fixture
def blocked_stage_project(tmp_path) -> Path:
    """A DVC project whose one stage, a real `star` command, reads its params from a FIFO: it waits there, like a
    stage busy training, until the test writes to it."""
    root = tmp_path / "project"
    root.mkdir()
    for command in (["git", "init", "-q"], [str(BIN / "dvc"), "init", "-q"]):
        subprocess.run(command, cwd=root, check=True, capture_output=True)
    (root / "dvc.yaml").write_text("stages:\n  world:\n    cmd: star world build --params params.fifo --out world\n"
                                   "    outs: [world]\n")
    os.mkfifo(root / "params.fifo")
    return root


def star_run_environment(marker: str) -> dict[str, str]:
    """Ours, pointed at the test's Prefect server, without MLflow or DVC settings, and with `marker` to find every
    process `star run` started."""
    from prefect.settings import PREFECT_API_URL

    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "DVC_", "STAR_"))}
    return {**env, "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", "PREFECT_API_URL": PREFECT_API_URL.value(),
            "DVC_NO_ANALYTICS": "1", "OMP_NUM_THREADS": "1", "STAR_TEST_MARKER": marker}


def start_star_run(root: Path, marker: str) -> tuple[subprocess.Popen, int]:
    """`star run` with its stage blocked on the FIFO; returns the process and the FIFO's write end."""
    with open(root.parent / "run.log", "w") as log:
        star = subprocess.Popen([str(BIN / "star"), "run"], cwd=root, stdout=log, stderr=subprocess.STDOUT,
                                env=star_run_environment(marker))
    writer = open_for_writing_once_read(root / "params.fifo", 240, star)
    return star, writer


def below(star: subprocess.Popen) -> list[str]:
    """What runs below `star run` (for the assertion message)."""
    return [" ".join(p.argv)[:120] for p in descendants(star.pid)]


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_stopping_star_run_leaves_no_dvc_or_stage_process_behind(blocked_stage_project, prefect_api, stop):
    marker = uuid.uuid4().hex
    star, writer = start_star_run(blocked_stage_project, marker)
    try:
        running = below(star)
        assert any(" repro " in line for line in running) and any("world build" in line for line in running), running
        stage, = [p for p in descendants(star.pid) if p.name == "star"]

        star.send_signal(stop)
        code = star.wait(timeout=60)
        left = gone_within(marker, 10)
        log = (blocked_stage_project.parent / "run.log").read_text()
        assert left == [], f"still running {len(left)} process(es) after `star run` got {stop.name}:\n{log[-3000:]}"
        assert not lifeline.is_alive(stage)
        if stop != signal.SIGKILL:  # stopped like the stage under it: cleanly, with its own exit code, whether
            # the signal interrupted our wait first or the stage's non-zero exit reached the flow first
            assert code == 128 + stop, log[-3000:]
            assert "\ninterrupted\n" in log and "pipeline failed" not in log, log[-3000:]
    finally:
        os.close(writer)
        star.kill()
        star.wait()
        kill_all(live_processes_with(marker))
