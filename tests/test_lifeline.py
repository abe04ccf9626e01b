"""A `star` stage does not outlive the `dvc repro` that started it, and SIGTERM stops `star` like Ctrl-C."""
from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components import lifeline
from components.lifeline import Process

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def process(pid: int, *argv: str) -> Process:
    return Process(pid=pid, ppid=1, start_time=100 + pid, state="S", argv=argv)


def test_parse_stat_reads_state_parent_and_start_time_even_with_parentheses_in_the_name():
    stat = "4242 (star (sft) x) S 4200 4242 4200 0 -1 4194304 10 0 0 0 5 1 0 0 20 0 3 0 987654 1000 50"
    assert lifeline.parse_stat(stat) == ("S", 4200, 987654)


@pytest.mark.parametrize("argv, name", [
    (["dvc", "repro"], "dvc"),
    (["/venv/bin/python", "/venv/bin/dvc", "repro"], "dvc"),
    (["python3.11", "-u", "-X", "dev", "-m", "dvc", "exp", "run"], "dvc"),
    (["/usr/bin/python3", "-mprefect.engine"], "prefect.engine"),
    (["/bin/bash", "--noprofile", "--norc", "-c", "star sft && echo done"], "bash"),
    (["python", "-c", "print(1)"], "python"),
    ([], ""),
])
def test_program_name_sees_through_the_python_interpreter(argv, name):
    assert lifeline.program_name(argv) == name


def test_the_launcher_is_dvc_or_prefect_seen_through_shells_and_wrappers():
    dvc = process(10, "/venv/bin/python", "/venv/bin/dvc", "repro")
    bash_c = process(11, "/bin/bash", "--noprofile", "--norc", "-c", "star sft && echo done")
    timeout = process(12, "timeout", "3600", "star", "sft")
    engine = process(13, "/venv/bin/python", "-m", "prefect.engine")
    assert lifeline.find_launcher([dvc, process(1, "/sbin/init")]) == dvc  # the shell exec'd star
    assert lifeline.find_launcher([timeout, bash_c, dvc]) == dvc
    assert lifeline.find_launcher([engine]) == engine
    # typed at a terminal, run by a test or by a script's own shell: nobody to follow
    assert lifeline.find_launcher([process(20, "-bash"), process(21, "sshd: me@pts/0")]) is None
    assert lifeline.find_launcher([process(20, "bash"), process(22, "tmux: server")]) is None
    assert lifeline.find_launcher([process(23, "/venv/bin/python", "-m", "pytest"), dvc]) is None
    assert lifeline.find_launcher([]) is None
    # a data-parallel stage: its workers, under the torchrun that `star rl` started, follow the dvc behind them
    torchrun = process(30, "/venv/bin/python", "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m",
                       "components.cli", "rl")
    star = process(31, "/venv/bin/python", "/venv/bin/star", "rl")
    assert lifeline.find_launcher([torchrun, star, bash_c, dvc]) == dvc
    assert lifeline.find_launcher([star, bash_c, dvc]) is None  # a star command is no wrapper on its own


def test_a_process_is_alive_until_it_exits_and_a_reused_pid_is_another_process():
    child = subprocess.Popen(["sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        while (seen := lifeline.read_process(child.pid)).argv != ("sleep", "60") and time.monotonic() < deadline:
            time.sleep(0.05)  # forked, not yet exec'd
        assert seen is not None and seen.ppid == os.getpid() and seen.argv == ("sleep", "60")
        assert lifeline.is_alive(seen)
        assert not lifeline.is_alive(Process(seen.pid, seen.ppid, seen.start_time + 1, seen.state, seen.argv))
        child.kill()
        deadline = time.monotonic() + 10
        while lifeline.read_process(child.pid).state != "Z" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not lifeline.is_alive(seen)  # killed, not yet reaped: a zombie
    finally:
        child.kill()
        child.wait()
    assert lifeline.read_process(child.pid) is None and not lifeline.is_alive(seen)
    assert lifeline.ancestors(os.getpid())[0].pid == os.getppid()


def open_for_writing_once_read(fifo: Path, timeout: float, *watched: subprocess.Popen) -> int:
    """Open the FIFO's write end as soon as a `star` command has opened it to read its params: from then on that
    command waits in read() for params that never come, like a stage busy training."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: no reader yet
                raise
        for proc in watched:
            assert proc.poll() is None, f"{proc.args} exited early with code {proc.returncode}"
        time.sleep(0.1)
    raise AssertionError(f"nothing opened {fifo} in {timeout} s")


def descendants(pid: int) -> list[Process]:
    """The live processes below `pid`."""
    found, parents = [], {pid}
    everyone = [p for p in (lifeline.read_process(int(d.name)) for d in Path("/proc").iterdir() if d.name.isdigit())
                if p is not None and p.state != "Z"]
    changed = True
    while changed:
        changed = False
        for p in everyone:
            if p.ppid in parents and p.pid not in parents:
                parents.add(p.pid)
                found.append(p)
                changed = True
    return found


def wait_until_gone(proc: Process, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while lifeline.is_alive(proc) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not lifeline.is_alive(proc)


def star_environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "DVC_"))}
    return {**env, "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", "DVC_NO_ANALYTICS": "1",
            "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_sigterm_stops_a_star_command_like_ctrl_c(tmp_path):
    fifo = tmp_path / "world.yaml"
    os.mkfifo(fifo)
    star = subprocess.Popen([str(BIN / "star"), "world", "build", "--params", str(fifo), "--out", str(tmp_path / "w")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=star_environment())
    writer = open_for_writing_once_read(fifo, 60, star)
    try:
        star.send_signal(signal.SIGTERM)
        _, err = star.communicate(timeout=20)
    finally:
        os.close(writer)
        star.kill()
    # not killed outright (-15): the KeyboardInterrupt path ran (`finally` blocks, MLflow run cleanup)
    assert star.returncode == 128 + signal.SIGTERM and err.strip() == "interrupted"


@pytest.mark.parametrize("cmd", [
    "star world build --params params.fifo --out world",  # the shell execs star: dvc is its parent
    "star world build --params params.fifo --out world && echo built",  # the shell waits between dvc and star
])
@pytest.mark.slow
def test_a_killed_dvc_repro_takes_its_star_stage_with_it(tmp_path, cmd):
    root = tmp_path / "project"
    root.mkdir()
    env = star_environment()
    for command in (["git", "init", "-q"], [str(BIN / "dvc"), "init", "-q"]):
        subprocess.run(command, cwd=root, check=True, capture_output=True, env=env)
    (root / "dvc.yaml").write_text(f"stages:\n  world:\n    cmd: {cmd}\n    outs: [world]\n")
    os.mkfifo(root / "params.fifo")
    with open(tmp_path / "repro.log", "w") as log:
        dvc = subprocess.Popen([str(BIN / "dvc"), "repro"], cwd=root, stdout=log, stderr=subprocess.STDOUT, env=env)
    writer, stage = None, []
    try:
        writer = open_for_writing_once_read(root / "params.fifo", 120, dvc)
        stage = [p for p in descendants(dvc.pid) if p.name == "star"]
        assert len(stage) == 1, stage

        dvc.kill()  # not reaped until the end: the stage must also see a zombie dvc as gone
        assert wait_until_gone(stage[0], timeout=10), f"star stage {stage[0].pid} still runs after dvc was killed"
        log_text = (tmp_path / "repro.log").read_text()
        assert (f"star world: the dvc process that started this stage (pid {dvc.pid}) is gone: stopping"
                in log_text.splitlines()), log_text
    finally:
        if writer is not None:
            os.close(writer)
        for orphan in stage + [p for p in descendants(dvc.pid)]:
            if lifeline.is_alive(orphan):
                os.kill(orphan.pid, signal.SIGKILL)
        dvc.kill()
        dvc.wait()


_FAKE_DVC = """#!{python}
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", sys.argv[1]])
time.sleep(600)
"""

_STAGE_THAT_IGNORES_INTERRUPTS = """
import os, time
from components import lifeline
with lifeline.held("stubborn", poll_seconds=0.1, grace_seconds=1):
    announced = False
    while True:
        try:  # the pid is printed inside the try: the launcher is killed as soon as the test reads it
            if not announced:
                announced = True
                print(os.getpid(), flush=True)
            time.sleep(600)
        except KeyboardInterrupt:
            print("caught", flush=True)
"""


def test_a_stage_that_swallows_the_interrupt_still_exits_after_the_grace_period(tmp_path):
    fake_dvc = tmp_path / "dvc"  # any process called dvc is a launcher
    fake_dvc.write_text(_FAKE_DVC.format(python=sys.executable))
    fake_dvc.chmod(0o755)
    launcher = subprocess.Popen([str(fake_dvc), _STAGE_THAT_IGNORES_INTERRUPTS], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=star_environment())
    stage = None
    try:
        stage = lifeline.read_process(int(launcher.stdout.readline()))
        launcher.kill()
        assert wait_until_gone(stage, timeout=10)
        out = launcher.stdout.read()
        assert "star stubborn: the dvc process that started this stage" in out and "caught" in out
        assert out.splitlines()[-1] == "star stubborn: did not stop within 1 s: exiting"
    finally:
        launcher.kill()
        launcher.wait()
        if stage is not None and lifeline.is_alive(stage):
            os.kill(stage.pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_plain_dvc_repro_groups_its_stage_runs_under_one_parent_run(tmp_path):
    """Like `star run`, a plain `dvc repro` gets one parent run: its first stage creates it, the next ones join it,
    and the next repro ends it (its dvc process is gone) and starts its own."""
    from mlflow.tracking import MlflowClient

    root = tmp_path / "project"
    root.mkdir()
    env = star_environment()
    for command in (["git", "init", "-q"], [str(BIN / "dvc"), "init", "-q"]):
        subprocess.run(command, cwd=root, check=True, capture_output=True, env=env)
    shutil.copy(REPO / "params" / "world.yaml", root / "world.yaml")
    stages = {name: {"cmd": f"star world build --params world.yaml --out {name} && echo {name}", "outs": [name]}
              for name in ("first", "second")}
    stages["second"]["deps"] = ["first"]
    (root / "dvc.yaml").write_text(json.dumps({"stages": stages}))
    for _ in range(2):
        subprocess.run([str(BIN / "dvc"), "repro", "--force"], cwd=root, check=True, capture_output=True, env=env,
                       timeout=300)

    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], order_by=["start_time ASC"])
    parents = [r for r in runs if r.data.tags.get("star.launcher") == "dvc"]
    stage_runs = [r for r in runs if r.data.tags.get("star.stage") == "world"]
    assert len(parents) == 2 and len(stage_runs) == 4
    for parent, pair in zip(parents, (stage_runs[:2], stage_runs[2:])):
        assert {r.data.tags["mlflow.parentRunId"] for r in pair} == {parent.info.run_id}
    assert parents[0].info.status == "FINISHED"  # ended by the second repro's first stage
