"""The engine process's ties to its stage (components/agent/engine_server.py, `die_with_parent`), without vLLM: a
stand-in child armed as the engine arms itself exits when its stage is SIGTERMed or SIGKILLed, through
PR_SET_PDEATHSIG or, without it, through the stdin watchdog alone."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The stage: starts the stand-in engine with a stdin pipe (as EngineProcess does), prints its pid once it is armed,
# waits.
STAGE = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, start_new_session=True)
child.stdout.readline()  # armed
print(child.pid, flush=True)
time.sleep(120)
"""
# The stand-in engine: armed like engine_server.main, then idle.
ENGINE = """
import os, sys, time
from components.agent.engine_server import die_with_parent
die_with_parent(os.getppid(), pdeathsig=sys.argv[1] == "pdeathsig")
print("armed", flush=True)
time.sleep(120)
"""


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux's")
@pytest.mark.parametrize("how", ["pdeathsig", "watchdog"])
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL])
def test_the_engine_exits_when_its_stage_is_killed(how, stop):
    stage = subprocess.Popen([sys.executable, "-c", STAGE, ENGINE, how], stdout=subprocess.PIPE, text=True,
                             cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    try:
        engine = int(stage.stdout.readline())  # printed once the engine is armed
        assert running(engine)
        stage.send_signal(stop)
        stage.wait()
        deadline = time.monotonic() + 30
        while running(engine) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not running(engine)
    finally:
        stage.kill()
        stage.wait()


def test_a_local_checkpoint_reaches_the_engine_as_an_absolute_path(tmp_path, monkeypatch):
    """The engine runs in the repository root, so `star rl --model models/sft` run from a project elsewhere must not
    send it `models/sft` (which it would look up there, then on the Hub); a Hub name passes through unchanged."""
    from components.agent.engine_client import model_argument

    (tmp_path / "models" / "sft").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert model_argument("models/sft") == str(tmp_path / "models" / "sft")
    assert model_argument(Path("models/sft")) == str(tmp_path / "models" / "sft")
    assert model_argument("Qwen/Qwen2.5-1.5B-Instruct") == "Qwen/Qwen2.5-1.5B-Instruct"
