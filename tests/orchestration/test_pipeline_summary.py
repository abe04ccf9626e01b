"""`star run`'s parent run sums the pipeline up for the MLflow UI: the checkpoints' headline metrics as it ends."""
from __future__ import annotations

import json
import os

import pytest

from .sample_project import make_sample_project

pytestmark = pytest.mark.slow


def test_the_flows_parent_run_ends_with_the_headline_metrics_of_the_checkpoints_in_metrics(tmp_path, mlflow_db,
                                                                                          monkeypatch, prefect_api):
    """flows/pipeline.py hands its workspace to the parent run: metrics/validate/<ckpt>.json, metrics/ood_qa/...
    there (here written before the run; a stage's would count the same) become `validate/sft/final_pass`, ..."""
    from mlflow.tracking import MlflowClient

    from flows.pipeline import pipeline

    root = make_sample_project(tmp_path / "project")
    (root / "metrics" / "validate").mkdir(parents=True)
    (root / "metrics" / "validate" / "sft.json").write_text(json.dumps({"strict": {"final_pass": 0.25}}))
    (root / "metrics" / "ood_qa").mkdir()
    (root / "metrics" / "ood_qa" / "sft.json").write_text(json.dumps({"em": 0.5, "f1": 0.625}))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{mlflow_db}")
    for name in ("STAR_PARENT_RUN_ID", "STAR_EXPERIMENT", "STAR_PRESET", "DVC_ROOT", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(root)
    try:
        assert pipeline(stages=["prepare"], root=str(root)) == {"prepare": "ran"}
    finally:
        os.chdir(tmp_path)
    client = MlflowClient()
    [parent] = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                  filter_string="tags.mlflow.runName = 'pipeline'")
    assert parent.data.metrics["validate/sft/final_pass"] == 0.25
    assert parent.data.metrics["ood_qa/sft/em"] == 0.5 and parent.data.metrics["ood_qa/sft/f1"] == 0.625
    assert parent.data.params["stages"] == '["prepare"]'
