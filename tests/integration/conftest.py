"""Real servers for the integration tests, each started once for this folder on a free 127.0.0.1 port:
moto's S3 server, an MLflow tracking server storing artifacts in that S3, and a Prefect API server.

Package-scoped (this folder is a package): the servers stop, and the environment is put back, after the last
integration test, so nothing reaches the tests of other folders (e.g. tests/orchestration's own Prefect server)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

BIN = Path(sys.executable).parent
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing-access-key",
    "AWS_SECRET_ACCESS_KEY": "testing-secret-key-xyz",
    "AWS_DEFAULT_REGION": "us-east-1",
    # S3-compatible stores other than AWS reject boto3's default checksums
    "AWS_REQUEST_CHECKSUM_CALCULATION": "when_required",
    "AWS_RESPONSE_CHECKSUM_VALIDATION": "when_required",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_up(url: str, process: subprocess.Popen, log: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server for {url} exited:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"server for {url} did not come up in {timeout} s:\n{log.read_text()[-3000:]}")


def server_environment(extra: dict[str, str]) -> dict[str, str]:
    """Our environment without any PREFECT_*/MLFLOW_* setting of the session (a server configures itself), plus
    `extra`."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    return {**inherited, **extra}


def launch(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    """Start a server in the background in its own process group, its output in `cwd/server.log`."""
    with open(cwd / "server.log", "w") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=server_environment(env), cwd=cwd,
                                start_new_session=True)


def stop(process: subprocess.Popen) -> None:
    """Stop a server and everything it started (mlflow's uvicorn and job consumers): SIGTERM, then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        try:  # the leader is gone; its children may linger a moment
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return


def restore(saved: dict[str, str | None]) -> None:
    """Put environment variables back as `saved` recorded them (None: was not set)."""
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def forget_prefect_services() -> None:
    """Stop Prefect's process-wide services (log and event workers, concurrency-slot acquirers).

    Each keeps the API client it was started with: one left over from another Prefect server would acquire `gpu`
    slots on that server while the flow releases them on this one, and the next GPU stage would wait forever.
    """
    from prefect._internal.concurrency.services import _QueueServiceBase

    _QueueServiceBase.drain_all(timeout=30, at_exit=False)


@pytest.fixture(scope="package")
def aws_env():
    """Fake AWS credentials for the integration tests (moto accepts any)."""
    saved = {k: os.environ.get(k) for k in AWS_ENV}
    os.environ.update(AWS_ENV)
    try:
        yield AWS_ENV
    finally:
        restore(saved)


@pytest.fixture(scope="package")
def servers(tmp_path_factory, aws_env):
    """moto's S3 server, an MLflow server with artifacts in its S3, and a Prefect server, started side by side
    (their start-up overlaps: about half the wall time of starting them one after the other)."""
    import boto3

    ports = {name: free_port() for name in ("s3", "mlflow", "prefect")}
    s3_url, mlflow_url = f"http://127.0.0.1:{ports['s3']}", f"http://127.0.0.1:{ports['mlflow']}"
    prefect_api = f"http://127.0.0.1:{ports['prefect']}/api"
    work = {name: tmp_path_factory.mktemp(name) for name in ports}
    launched = {
        "s3": launch([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(ports["s3"])], work["s3"], {}),
        "mlflow": launch([str(BIN / "mlflow"), "server", "--backend-store-uri",
                          f"sqlite:///{work['mlflow'] / 'mlflow.db'}", "--artifacts-destination",
                          "s3://star-mlflow/artifacts", "--host", "127.0.0.1", "--port", str(ports["mlflow"]),
                          "--workers", "1"], work["mlflow"], {"MLFLOW_S3_ENDPOINT_URL": s3_url}),
        "prefect": launch([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port",
                           str(ports["prefect"])], work["prefect"], prefect_env(work["prefect"])),
    }
    try:
        for name, url in (("s3", f"{s3_url}/moto-api/"), ("mlflow", f"{mlflow_url}/health"),
                          ("prefect", f"{prefect_api}/health")):
            wait_until_up(url, launched[name], work[name] / "server.log")
        s3 = boto3.client("s3", endpoint_url=s3_url)
        for bucket in ("star-mlflow", "star-dvc"):
            s3.create_bucket(Bucket=bucket)
        yield {"s3": s3_url, "mlflow": mlflow_url, "prefect": prefect_api, "prefect_home": work["prefect"]}
    finally:
        for process in launched.values():
            stop(process)


def prefect_env(home: Path) -> dict[str, str]:
    return {"PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{home / 'prefect.db'}"}


@pytest.fixture(scope="package")
def s3_endpoint(servers) -> str:
    """moto's S3 server, with the buckets `star-mlflow` and `star-dvc`."""
    return servers["s3"]


@pytest.fixture(scope="package")
def mlflow_server(servers) -> str:
    """`mlflow server` on sqlite with artifacts proxied to s3://star-mlflow/artifacts on moto."""
    return servers["mlflow"]


@pytest.fixture(scope="package")
def prefect_server(servers) -> str:
    """`prefect server start` on its own PREFECT_HOME; the flows, clients and subprocesses of these tests talk
    to it (in-process settings and environment both point at it, and are put back afterwards)."""
    api = servers["prefect"]
    saved = {k: os.environ.get(k) for k in ("PREFECT_API_URL", "PREFECT_HOME", "PREFECT_SERVER_ANALYTICS_ENABLED")}
    os.environ.update(PREFECT_API_URL=api, PREFECT_HOME=str(servers["prefect_home"]),
                      PREFECT_SERVER_ANALYTICS_ENABLED="false")
    from prefect.settings import PREFECT_API_URL, temporary_settings

    forget_prefect_services()
    try:
        with temporary_settings(updates={PREFECT_API_URL: api}):
            yield api
            forget_prefect_services()  # flush logs and events to this server while it still runs
    finally:
        restore(saved)


SMOKE_EXPERIMENT = "ui-smoke"


@pytest.fixture(scope="package")
def smoke_project(tmp_path_factory, mlflow_server) -> tuple[Path, dict[str, str]]:
    """`star preset use smoke && dvc repro` in a fresh copy of the checkout, tracked by the MLflow server in the
    experiment `ui-smoke` (~6 minutes on 2 cores): once per test session, shared by the MLflow-UI checks, the
    documented examples and the second-repro check. Returns (the copy, its environment). System metrics are sampled
    every second: the smoke stages are short."""
    from project_copy import copy_project, project_environment

    root = copy_project(tmp_path_factory.mktemp("smoke") / "project")
    env = {**project_environment(root), "MLFLOW_TRACKING_URI": mlflow_server, "STAR_EXPERIMENT": SMOKE_EXPERIMENT,
           "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL": "1", "MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING": "1"}
    for command, timeout in ((["star", "preset", "use", "smoke"], 120), (["dvc", "repro"], 1800)):
        done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"{command} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return root, env
