"""The pipeline flow on a small DVC project: one task per stage, GPU slots, MLflow parent/child runs."""
from __future__ import annotations

import json
import os

import pytest

from .sample_project import make_sample_project

pytestmark = pytest.mark.slow


@pytest.fixture
def project(tmp_path, mlflow_db, monkeypatch, prefect_api):
    """The sample project with its own MLflow store, run from its root."""
    root = make_sample_project(tmp_path / "project", stage_seconds=1.0)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{mlflow_db}")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env-secret-flow-42")
    for name in ("STAR_PARENT_RUN_ID", "STAR_EXPERIMENT", "DVC_ROOT", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(root)
    yield root
    os.chdir(tmp_path)


def task_runs_of(state):
    """The task runs of a finished flow run, from the Prefect API."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        return client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[
            state.state_details.flow_run_id])))


def test_the_flow_runs_each_stage_once_in_order_with_gpu_stages_one_at_a_time(project):
    from mlflow.tracking import MlflowClient

    from flows.pipeline import ensure_gpu_limit, pipeline

    assert ensure_gpu_limit(1) == 1
    state = pipeline(root=str(project), return_state=True)
    assert state.result() == {"prepare": "ran", "train_a": "ran", "train_b": "ran", "report": "ran"}
    runs = task_runs_of(state)
    assert sorted(r.name for r in runs) == ["prepare", "report", "train_a", "train_b"]
    assert all(r.state.is_completed() for r in runs)

    a, b = (json.loads((project / "models" / f"{m}.json").read_text()) for m in ("a", "b"))
    first, second = sorted([a, b], key=lambda t: t["started"])
    assert first["finished"] <= second["started"], "two GPU stages overlapped with a gpu limit of 1"

    client = MlflowClient()
    [parent] = client.search_runs(client.search_experiments()[0].experiment_id.split(),
                                  filter_string="tags.mlflow.runName = 'pipeline'")
    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert sorted(c.data.tags["dvc.stage"] for c in children) == ["train_a", "train_b"]  # the stages that log
    for child in children:
        assert child.data.params["lr"] in ("0.1", "0.2")
        assert len(client.get_metric_history(child.info.run_id, f"{child.data.tags['dvc.stage']}/loss")) == 3
        assert child.data.tags["dvc.lock_hash"] == parent.data.tags[f"stage.{child.data.tags['dvc.stage']}.lock_hash"]
    cached_runs = {p.name for p in (project / ".dvc" / "cache" / "runs").glob("*/*")}
    for stage in ("prepare", "train_a", "train_b", "report"):
        assert parent.data.tags[f"stage.{stage}.status"] == "ran"
        assert parent.data.tags[f"stage.{stage}.lock_hash"] in cached_runs
    secrets = json.dumps([[r.data.params, r.data.tags] for r in [parent, *children]])
    assert "sk-sample-secret-a1b2c3" not in secrets and "sk-env-secret-flow-42" not in secrets

    again = pipeline(root=str(project))
    assert set(again.values()) == {"unchanged"}
    assert len(client.search_runs([parent.info.experiment_id], "tags.`dvc.stage` = 'train_a'")) == 1


def test_a_stage_restored_from_the_run_cache_is_recorded_on_the_parent(project):
    from mlflow.tracking import MlflowClient

    from flows.pipeline import pipeline

    params = project / "params" / "prepare.yaml"
    assert pipeline(stages=["prepare"], root=str(project)) == {"prepare": "ran"}
    params.write_text("prepare:\n  n: 6\n")
    assert pipeline(stages=["prepare"], root=str(project)) == {"prepare": "ran"}
    params.write_text("prepare:\n  n: 5\n")
    assert pipeline(stages=["prepare"], root=str(project)) == {"prepare": "restored"}
    client = MlflowClient()
    latest = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                filter_string="tags.mlflow.runName = 'pipeline'", order_by=["start_time DESC"])[0]
    assert latest.data.tags["stage.prepare.status"] == "restored"
    assert len(latest.data.tags["stage.prepare.lock_hash"]) == 64


def test_a_user_error_fails_the_flow_at_once_with_the_stage_log(project):
    from flows.pipeline import pipeline

    (project / "params" / "prepare.yaml").write_text("prepare:\n  n: five\n")
    state = pipeline(root=str(project), retries=2, return_state=True)
    assert state.is_failed()
    with pytest.raises(RuntimeError, match=r"(?s)stage 'prepare' failed.*params/prepare.yaml: prepare.n must be"):
        state.result()
    runs = {r.name: r for r in task_runs_of(state)}
    assert runs["prepare"].run_count == 1  # a user error is not retried
    assert not runs["report"].state.is_completed()


def test_bad_params_stop_the_flow_before_any_stage_runs(project):
    from components.errors import UserError
    from flows.pipeline import pipeline

    (project / "params" / "sft.yaml").write_text("sft:\n  epochs: three\n")
    with pytest.raises(UserError, match=r"(?s)params/sft.yaml: invalid params.*sft.epochs"):
        pipeline(root=str(project))
    assert not (project / "dvc.lock").exists()
