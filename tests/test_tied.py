"""`lifeline.tied`: a child, and everything it starts, stops with the process that started it, even after SIGKILL."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid

import pytest

from components import lifeline

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl and /proc")

# A parent that starts, through `tied`, a child that starts a grandchild (as `mlflow ui` starts its workers, and
# `dvc repro` its stage); it prints the child's pid (its process group) once the grandchild runs, then waits.
_PARENT = """
import subprocess, sys, time
from components import lifeline
grandchild = "import time; print('grandchild up', flush=True); time.sleep(600)  # {marker}"
child = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {grandchild!r}]); time.sleep(600)"
with lifeline.tied([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True) as process:
    process.stdout.readline()
    print(process.pid, flush=True)
    process.wait()
"""


def group_alive_within(pgid: int, seconds: float) -> list[int]:
    """The processes of group `pgid` still alive after waiting up to `seconds` for it to empty."""
    deadline = time.monotonic() + seconds
    while (left := lifeline.group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM])
def test_a_tied_child_and_what_it_started_stop_when_the_parent_is_killed(stop):
    marker = uuid.uuid4().hex
    parent = subprocess.Popen([sys.executable, "-c", _PARENT.replace("{marker}", marker)], stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    pgid = None
    try:
        pgid = int(parent.stdout.readline())
        assert len(lifeline.group_members(pgid)) == 3  # the guard, the child, the grandchild
        parent.send_signal(stop)  # SIGTERM: no handler in the parent, so it dies at once, like SIGKILL
        parent.wait(timeout=10)
        assert group_alive_within(pgid, 10) == []
    finally:
        parent.kill()
        parent.wait()
        if pgid is not None:
            lifeline.signal_group(pgid, signal.SIGKILL)


def test_the_guard_exits_as_its_child_does():
    exits = subprocess.run(lifeline.guarded([sys.executable, "-c", "raise SystemExit(3)"]), timeout=60)
    killed = subprocess.run(lifeline.guarded([sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"]),
                            timeout=60)
    assert (exits.returncode, killed.returncode) == (3, -signal.SIGKILL)


def test_leaving_the_block_stops_what_still_runs_and_nothing_starts_once_stopping():
    with lifeline.tied([sys.executable, "-c", "import time; time.sleep(600)"]) as process:
        pass
    assert process.returncode is not None and lifeline.group_members(process.pid) == []
    lifeline.forward_stop(signal.SIGTERM)
    try:
        with pytest.raises(lifeline.Stopping, match="this command is stopping"):
            with lifeline.tied([sys.executable, "-c", "pass"]):
                pass
    finally:
        lifeline._STOPPING.clear()
