"""GPU slots: how many GPUs this machine shows, and which device ids a stage holding n slots may use.

The Prefect global concurrency limit `gpu` (sized to the visible GPUs, at least 1) bounds how many GPU stages run
at once; within a machine, per-device lock files decide *which* devices a stage gets, so two stages never share
one and `CUDA_VISIBLE_DEVICES` can be set for the stage's process.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

GPU_LIMIT = "gpu"


def visible_gpus(environ: Mapping[str, str] | None = None) -> list[str]:
    """Device ids this process may use: `CUDA_VISIBLE_DEVICES` when set, else what `nvidia-smi -L` lists."""
    environ = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" in environ:
        ids = [d.strip() for d in environ["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
        return [] if ids[:1] == ["-1"] else ids
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(out.stdout.splitlines()) if line.startswith("GPU ")]


def slot_count(gpus: list[str]) -> int:
    """Size of the `gpu` limit: one slot per visible GPU, and one on CPU-only machines (GPU stages then run on CPU)."""
    return max(1, len(gpus))


def slots_needed(stage: str, gpus: int, visible: list[str]) -> int:
    """The `gpu` slots a stage asking for `gpus` takes: that many on a GPU machine (an error when it shows fewer),
    the machine's one slot on a CPU-only one (its processes then share the CPU)."""
    if not visible:
        return min(gpus, 1)
    if gpus > len(visible):
        from components.errors import UserError

        raise UserError(f"stage {stage} needs {gpus} GPUs (its meta gpu in dvc.yaml, from its params' process count) "
                        f"and this machine shows {len(visible)} ({', '.join(visible)}): lower the stage's processes "
                        "or run it where more GPUs are visible")
    return gpus


def cuda_env(devices: list[str]) -> dict[str, str]:
    """The environment that pins a stage process to `devices` (nothing to pin on a CPU-only machine)."""
    return {"CUDA_VISIBLE_DEVICES": ",".join(devices)} if devices else {}


@contextlib.contextmanager
def claim_devices(count: int, devices: list[str], lock_dir: Path | None = None,
                  poll_seconds: float = 0.5) -> Iterator[list[str]]:
    """Hold `count` of `devices` exclusively (machine-wide file locks) for the duration of the block.

    Yields [] when the machine has no GPUs. Waits while other holders have too many devices in use (the Prefect
    limit normally makes that wait zero).
    """
    if not devices or count <= 0:
        yield []
        return
    count = min(count, len(devices))
    lock_dir = lock_dir or Path(tempfile.gettempdir()) / "star-gpu-locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    held: list[tuple[str, int]] = []
    try:
        while len(held) < count:
            for device in devices:
                if len(held) == count or any(d == device for d, _ in held):
                    continue
                fd = os.open(lock_dir / f"gpu-{device}.lock", os.O_CREAT | os.O_RDWR, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    held.append((device, fd))
                except BlockingIOError:
                    os.close(fd)
            if len(held) < count:  # all or nothing, so two partial holders never wait on each other
                _release(held)
                held = []
                time.sleep(poll_seconds)
        yield [device for device, _ in held]
    finally:
        _release(held)


def _release(held: list[tuple[str, int]]) -> None:
    for _, fd in held:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


class LocalSlots:
    """An in-process count of GPU slots: tasks of one flow queue here first, so the Prefect limit is asked only
    when a slot is free (its acquire otherwise polls with back-off, seconds between a release and the next start).
    """

    def __init__(self, size: int):
        self.size = size
        self.free = size
        self._changed = threading.Condition()

    @contextlib.contextmanager
    def hold(self, count: int) -> Iterator[None]:
        """Take `count` slots at once (at most the size), waiting until that many are free."""
        count = min(count, self.size)
        with self._changed:
            self._changed.wait_for(lambda: self.free >= count)
            self.free -= count
        try:
            yield
        finally:
            with self._changed:
                self.free += count
                self._changed.notify_all()
