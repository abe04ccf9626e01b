"""Resumable RL checkpoints: model, optimizer, scheduler, RNG states, data cursor and the per-step history.

Layout under `--checkpoints` (a DVC `persist: true` output, so it survives `dvc repro` deleting the outputs):

    step-00000005/   model + tokenizer (save_pretrained), optimizer.pt, rng.pt, state.json

A checkpoint is written into a temporary sibling directory and renamed into place, and `state.json` is the last
file written: a directory named `step-N` is therefore always complete, and a run killed mid-write leaves only a
`.tmp-*` directory that the next run removes. `state.json` also holds the rows of plots/rl/rewards.csv up to that
step, so a resumed run can rewrite the plot file (which `dvc repro` deletes) without losing or repeating a step.
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STEP_DIR = re.compile(r"^step-(\d{8})$")
STATE_FILE = "state.json"
RNG_FILE = "rng.pt"


@dataclass
class TrainState:
    """What a resumed run needs besides the weights: the last finished step, the data cursor, the history rows."""

    step: int = 0
    cursor: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def complete_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint under `root`, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = STEP_DIR.match(path.name)
        if match and path.is_dir() and (path / STATE_FILE).exists():
            found.append((int(match.group(1)), path))
    return sorted(found)


def newest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    found = complete_checkpoints(root)
    return found[-1][1] if found else None


def remove_partial(root: str | Path) -> list[Path]:
    """Delete the temporary directories a killed run left behind; return them."""
    root = Path(root)
    removed = [p for p in root.glob("*.tmp-*") if p.is_dir()] if root.is_dir() else []
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def capture_rng() -> dict[str, Any]:
    """Python, NumPy and torch (CPU and CUDA) generator states."""
    import numpy as np
    import torch

    states = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng(states: dict[str, Any]) -> None:
    """Put back what `capture_rng` saved."""
    import numpy as np
    import torch

    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write JSON through a temporary file and an atomic rename."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def save_checkpoint(root: str | Path, state: TrainState, save_model, save_optimizer, keep: int) -> Path:
    """Write checkpoint `step-<state.step>` atomically and keep only the newest `keep`.

    `save_model(dir)` writes the weights and tokenizer; `save_optimizer(dir)` the optimizer/scheduler state.
    """
    import torch

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dir_name(state.step)
    tmp = root / f"{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_model(tmp)
    save_optimizer(tmp)
    torch.save(capture_rng(), tmp / RNG_FILE)
    write_json_atomic(tmp / STATE_FILE, {"step": state.step, "cursor": state.cursor, "history": state.history,
                                         "extra": state.extra})
    if final.exists():  # the same step saved again (a resumed run that redid it): replace it
        shutil.rmtree(final)
    os.replace(tmp, final)
    for _, old in complete_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_state(checkpoint: str | Path) -> TrainState:
    """The TrainState of a checkpoint directory (RNG states are restored separately, see `restore_checkpoint_rng`)."""
    data = json.loads((Path(checkpoint) / STATE_FILE).read_text())
    return TrainState(step=data["step"], cursor=data.get("cursor", {}), history=data.get("history", []),
                      extra=data.get("extra", {}))


def restore_checkpoint_rng(checkpoint: str | Path) -> None:
    import torch

    restore_rng(torch.load(Path(checkpoint) / RNG_FILE, weights_only=False))
