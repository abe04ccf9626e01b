"""`star ui --start` with real processes: a busy port fails at once, SIGTERM stops the servers and all they started."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from components.orchestration import commands

BIN = Path(sys.executable).parent
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def live_processes_with(marker: str, where: str = "environ") -> list[int]:
    """Pids of the live (not zombie) processes whose environment (or command line) holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / where).read_bytes() and \
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def gone_within(marker: str, seconds: float, where: str = "environ") -> list[int]:
    """The processes with `marker` still alive after waiting up to `seconds` for them to end."""
    deadline = time.monotonic() + seconds
    while (left := live_processes_with(marker, where)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def project(tmp_path) -> Path:
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    return tmp_path


def ui_environment(project: Path, marker: str) -> dict[str, str]:
    """Ours without any PREFECT_*/MLFLOW_*/DVC_* setting (the servers configure themselves), a Prefect home of the
    test's own, and `marker` for finding every process `star ui` started."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "DVC_"))}
    return {**env, "PREFECT_HOME": str(project / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "STAR_TEST_MARKER": marker, "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_ui_start_on_a_busy_port_fails_in_one_line_before_starting_anything(project):
    marker = uuid.uuid4().hex
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run([str(BIN / "star"), "ui", "--start", "--mlflow-port", str(free_port()),
                                 "--prefect-port", str(port)], cwd=project, capture_output=True, text=True,
                                env=ui_environment(project, marker), timeout=120)
    left = live_processes_with(marker)
    kill_all(left)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"star ui: error: port {port} on 127.0.0.1 is already in use, so the prefect server cannot start: stop what "
        "listens there or pass --prefect-port with a free port"]
    assert left == []  # no server was started


_FAKE_SERVER = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; open({ready!r}, 'w').close(); time.sleep(600)  # {marker}"])
time.sleep(600)  # {marker}
"""
_FAKE_SERVER_THAT_DIES = """
import os, sys, time
while not os.path.exists({ready!r}):
    time.sleep(0.05)
sys.exit(3)  # {marker}
"""


def test_a_server_that_exits_by_itself_fails_star_ui_and_stops_the_other_with_its_children(tmp_path, capsys):
    marker, ready = uuid.uuid4().hex, str(tmp_path / "worker-ready")
    servers = {"mlflow": [sys.executable, "-c", _FAKE_SERVER_THAT_DIES.format(ready=ready, marker=marker)],
               "prefect": [sys.executable, "-c", _FAKE_SERVER.format(ready=ready, marker=marker)]}
    try:
        assert commands.serve(servers, tmp_path) == 1
        assert capsys.readouterr().err.splitlines() == [
            "star ui: error: the mlflow server exited with code 3 (its log is above)"]
        assert gone_within(marker, 10, where="cmdline") == []  # the prefect server and the worker it started
    finally:
        kill_all(live_processes_with(marker, where="cmdline"))


def start_ui(project: Path, marker: str) -> tuple[subprocess.Popen, int, int]:
    """`star ui --start` on free ports, once both servers answer: the process, the MLflow and the Prefect port (its
    output in project/ui.log)."""
    import httpx

    mlflow_port, prefect_port = free_port(), free_port()
    with open(project / "ui.log", "w") as log:
        star = subprocess.Popen([str(BIN / "star"), "ui", "--start", "--mlflow-port", str(mlflow_port),
                                 "--prefect-port", str(prefect_port)], cwd=project, stdout=log,
                                stderr=subprocess.STDOUT, env=ui_environment(project, marker))
    deadline = time.monotonic() + 300  # both servers, on a loaded 2-core machine
    try:
        for url in (f"http://127.0.0.1:{mlflow_port}/", f"http://127.0.0.1:{prefect_port}/api/health"):
            while True:
                assert star.poll() is None, (project / "ui.log").read_text()[-3000:]
                assert time.monotonic() < deadline, f"{url} did not come up:\n{(project / 'ui.log').read_text()}"
                try:
                    if httpx.get(url, timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
    except BaseException:
        star.kill()
        star.wait()
        kill_all(live_processes_with(marker))
        raise
    return star, mlflow_port, prefect_port


@pytest.mark.slow
def test_sigterm_stops_star_ui_and_every_server_process(project):
    marker = uuid.uuid4().hex
    star, _, _ = start_ui(project, marker)
    try:
        assert len(live_processes_with(marker)) > 3  # star, both servers, mlflow's uvicorn and job consumers

        star.send_signal(signal.SIGTERM)
        assert star.wait(timeout=60) == 0
        assert gone_within(marker, 10) == []
    finally:
        star.kill()
        star.wait()
        kill_all(live_processes_with(marker))


@pytest.mark.slow
def test_sigkill_of_star_ui_stops_every_server_process_and_frees_both_ports(project):
    """SIGKILL runs no cleanup in `star ui`: the servers must notice by themselves that it is gone."""
    marker = uuid.uuid4().hex
    star, mlflow_port, prefect_port = start_ui(project, marker)
    try:
        star.kill()
        star.wait()
        left = gone_within(marker, 60)  # the servers' own shutdown, then SIGKILL for what is left
        assert left == [], [Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:120] for pid in left]
        assert not commands.port_in_use(mlflow_port) and not commands.port_in_use(prefect_port)
    finally:
        star.kill()
        star.wait()
        kill_all(live_processes_with(marker))
