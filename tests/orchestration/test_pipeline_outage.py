"""The parent run of `star run` / `star sweep` survives a tracking outage like a stage's run: a short wait once, one
line, a spool that `star mlflow replay` puts back as one tree of runs."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from components import tracking

from .sample_project import make_sample_project
from .test_tracking import closed_port_uri, warnings_in

pytestmark = pytest.mark.slow

PARENT_SPOOL_ENV, LIMITS_ENV = "STAR_PARENT_SPOOL", "STAR_MLFLOW_HTTP_LIMITS"
TRACKING_ENV = ("DVC_ROOT", "DVC_STAGE", "DVC_EXP_NAME", "CUDA_VISIBLE_DEVICES", tracking.PARENT_RUN_ENV,
                PARENT_SPOOL_ENV, tracking.EXPERIMENT_ENV, tracking.PRESET_ENV, LIMITS_ENV, *tracking.STAGE_HTTP_LIMITS)


@pytest.fixture
def clean_env(monkeypatch):
    """No tracking settings from the environment: MLflow's own HTTP defaults, no parent run."""
    for name in TRACKING_ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def spools_by_run() -> dict[str, tuple[dict, list[dict]]]:
    """The pending spools by run name: (start record, the calls)."""
    spools = {}
    for path in tracking.pending_spools():
        start, *calls = tracking.read_spool(path)
        spools[start["run_name"]] = (dict(start, file=path.name), calls)
    return spools


@pytest.fixture
def project(tmp_path, mlflow_db, clean_env, prefect_api):
    """The sample project, run from its root, with MLflow at a port where nothing listens."""
    root = make_sample_project(tmp_path / "project")
    clean_env.setenv("MLFLOW_TRACKING_URI", closed_port_uri())
    clean_env.chdir(root)
    yield root
    os.chdir(tmp_path)


def test_star_run_without_mlflow_runs_every_stage_after_one_warning_and_replays_as_one_tree(
        project, mlflow_db, monkeypatch, capsys):
    """The parent run used MLflow's default retries: a closed port cost 4 minutes, then the flow failed."""
    from mlflow.tracking import MlflowClient

    from components.cli import main
    from flows.pipeline import pipeline

    start = time.monotonic()
    statuses = pipeline(root=str(project))
    seconds = time.monotonic() - start
    with capsys.disabled():
        print(f"\nstar run's flow with MLflow unreachable: {seconds:.1f} s")
    assert statuses == {"prepare": "ran", "train_a": "ran", "train_b": "ran", "report": "ran"}
    err = capsys.readouterr().err
    warning, = warnings_in(err)
    assert warning.startswith("[pipeline] MLflow at http://127.0.0.1:") and "Connection refused" in warning
    assert warning.endswith("replay with `star mlflow replay`")  # every spool: the stages spool beside it
    assert seconds < 60, seconds

    spools = spools_by_run()
    assert sorted(spools) == ["pipeline", "train_a", "train_b"]  # the stages that log
    parent_start, parent_calls = spools["pipeline"]
    assert parent_start["run_id"] is None and parent_calls[-1] == {**parent_calls[-1], "status": "FINISHED"}
    for stage in ("train_a", "train_b"):
        assert spools[stage][0]["parent_spool"] == parent_start["file"]

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{mlflow_db}")  # MLflow is back
    assert main(["mlflow", "replay"]) == 0
    assert tracking.pending_spools() == []
    client = MlflowClient(f"sqlite:///{mlflow_db}")
    experiment_ids = [e.experiment_id for e in client.search_experiments()]
    parent, = client.search_runs(experiment_ids, filter_string="tags.mlflow.runName = 'pipeline'")
    assert parent.info.status == "FINISHED" and parent.data.tags["stage.train_a.status"] == "ran"
    children = client.search_runs(experiment_ids, filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert sorted(child.info.run_name for child in children) == ["train_a", "train_b"]
    assert {child.data.params["lr"] for child in children} == {"0.1", "0.2"}


@pytest.fixture
def store(tmp_path, mlflow_db, clean_env):
    """A project folder with its own sqlite store (for the replay), run from its root."""
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    clean_env.chdir(tmp_path)
    return f"sqlite:///{mlflow_db}"


def test_a_sweep_against_a_server_that_never_answers_waits_about_30_seconds_once(store, monkeypatch, capsys):
    """A hung server (it accepts connections and never answers) cost the parent MLflow's 7 retries of 120 s."""
    from mlflow.tracking import MlflowClient

    from components.cli import main

    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(64)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{hung.getsockname()[1]}")
        start = time.monotonic()
        with tracking.pipeline_run("sweep", params={"variants": ["a", "b"]}) as sweep:
            for variant in ("a", "b"):
                with tracking.pipeline_run(variant, params={"overrides": [variant]}, parent=sweep) as run:
                    for name, value in run.env().items():  # what the variant's stage processes get
                        monkeypatch.setenv(name, value)
                    with tracking.stage_run("sft") as stage:
                        stage.log_metrics({"loss": 1.0}, step=0)
                    run.record_stage("sft", "ran", "f" * 64, 1.0)
        seconds = time.monotonic() - start
    with capsys.disabled():
        print(f"\na sweep of two variants against a server that never answers: {seconds:.1f} s")
    warning, = warnings_in(capsys.readouterr().err)
    assert warning.startswith("[sweep] ") and "timed out" in warning
    assert seconds < 60, seconds

    starts = [tracking.read_spool(path)[0] for path in tracking.pending_spools()]
    assert sorted(start["run_name"] for start in starts) == ["a", "b", "sft", "sft", "sweep"]
    assert all(start["run_id"] is None for start in starts)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    for name in (tracking.PARENT_RUN_ENV, PARENT_SPOOL_ENV):
        monkeypatch.delenv(name, raising=False)
    assert main(["mlflow", "replay"]) == 0
    client = MlflowClient(store)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    by_id = {run.info.run_id: run for run in runs}
    tree = sorted((run.info.run_name, by_id[run.data.tags["mlflow.parentRunId"]].info.run_name
                   if "mlflow.parentRunId" in run.data.tags else None) for run in runs)
    assert tree == [("a", "sweep"), ("b", "sweep"), ("sft", "a"), ("sft", "b"), ("sweep", None)]
    assert {run.info.status for run in runs} == {"FINISHED"}


_UPLOAD_TIMEOUT_OF_A_STAGE = """
import os
from components import tracking
with tracking.limited_http_waits(), tracking._upload_timeout():
    print(os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"])
"""


def test_a_stage_under_a_pipeline_run_lifts_the_pipelines_http_timeout_for_uploads(clean_env, tmp_path):
    """The pipeline run's short HTTP timeout reaches its stages through the environment; taken for the user's own
    setting, it would cut a model upload to an S3-backed server at 8 s."""
    with tracking.limited_http_waits():
        stage_env = dict(os.environ)
    assert LIMITS_ENV not in os.environ and "MLFLOW_HTTP_REQUEST_TIMEOUT" not in os.environ
    done = subprocess.run([sys.executable, "-c", _UPLOAD_TIMEOUT_OF_A_STAGE], env=stage_env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == tracking.UPLOAD_TIMEOUT, done.stderr[-2000:]

    stage_env["MLFLOW_HTTP_REQUEST_TIMEOUT"] = "30"  # the user's own setting wins
    done = subprocess.run([sys.executable, "-c", _UPLOAD_TIMEOUT_OF_A_STAGE], env=stage_env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "30", done.stderr[-2000:]
