"""The pipeline flow against real servers: Prefect API, MLflow tracking server, artifacts in S3 (moto)."""
from __future__ import annotations

import json
import os

import boto3
import pytest

from orchestration.sample_project import make_sample_project

pytestmark = pytest.mark.integration


@pytest.fixture
def project(tmp_path, monkeypatch, mlflow_server, prefect_server):
    root = make_sample_project(tmp_path / "project", stage_seconds=0.5)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.setenv("STAR_EXPERIMENT", f"it-{tmp_path.name}")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env-secret-integration-77")
    for name in ("STAR_PARENT_RUN_ID", "DVC_ROOT", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(root)
    yield root
    os.chdir(tmp_path)


def flow_run_logs(flow_run_id) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with get_client(sync_client=True) as client:
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])), limit=200)
    return "\n".join(log.message for log in logs)


def test_parent_run_children_metrics_artifacts_in_s3_and_no_secret(project, s3_endpoint):
    from mlflow.tracking import MlflowClient

    from flows.pipeline import pipeline

    state = pipeline(root=str(project), return_state=True)
    assert state.result() == {"prepare": "ran", "train_a": "ran", "train_b": "ran", "report": "ran"}

    client = MlflowClient()
    experiment = client.get_experiment_by_name(os.environ["STAR_EXPERIMENT"])
    [parent] = client.search_runs([experiment.experiment_id], "tags.mlflow.runName = 'pipeline'")
    children = client.search_runs([experiment.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert sorted(c.data.tags["dvc.stage"] for c in children) == ["train_a", "train_b"]
    for child in children:
        assert set(child.data.params) >= {"lr", "seconds"}
        loss = f"{child.data.tags['dvc.stage']}/loss"  # named under its stage
        assert [m.step for m in client.get_metric_history(child.info.run_id, loss)] == [0, 1, 2]
        assert [a.path for a in client.list_artifacts(child.info.run_id)] in (["a.json"], ["b.json"])
        assert child.info.artifact_uri.startswith("mlflow-artifacts:")
    assert client.list_artifacts(parent.info.run_id)[0].path == "stages.json"

    keys = [o["Key"] for o in boto3.client("s3", endpoint_url=s3_endpoint).list_objects_v2(
        Bucket="star-mlflow", Prefix="artifacts/")["Contents"]]
    for child in children:
        assert any(child.info.run_id in key for key in keys), "artifacts did not reach S3"

    visible = json.dumps([[r.data.params, r.data.tags] for r in [parent, *children]])
    logs = flow_run_logs(state.state_details.flow_run_id)
    assert "Running stage 'train_a'" in logs  # the stage logs reach Prefect
    for secret in ("sk-sample-secret-a1b2c3", "sk-env-secret-integration-77", os.environ["AWS_SECRET_ACCESS_KEY"]):
        assert secret not in visible and secret not in logs
