"""Ablations: `dvc exp run -S` through the sweep flow re-runs only the stages the changed param reaches."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestration.sample_project import make_sample_project

pytestmark = pytest.mark.integration
DVC = str(Path(sys.executable).parent / "dvc")


@pytest.fixture
def reproduced(tmp_path, monkeypatch, mlflow_server, prefect_server):
    """The sample project, fully reproduced and committed (experiments start from a commit)."""
    root = make_sample_project(tmp_path / "project")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.setenv("STAR_EXPERIMENT", f"it-{tmp_path.name}")
    monkeypatch.delenv("STAR_PARENT_RUN_ID", raising=False)
    monkeypatch.chdir(root)
    subprocess.run([DVC, "repro"], cwd=root, check=True, capture_output=True)
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run(["git", "commit", "-qm", "reproduced"], cwd=root, check=True)
    yield root
    os.chdir(tmp_path)


def test_a_sweep_variant_reruns_only_the_affected_stages(reproduced):
    from mlflow.tracking import MlflowClient

    from flows.sweep import sweep

    state = sweep(variants={"b-lr": ["params/train.yaml:train.b.lr=0.5"]}, root=str(reproduced),
                  return_state=True)
    exp_name = state.result()["b-lr"]

    shown = json.loads(subprocess.run([DVC, "exp", "show", "--json"], cwd=reproduced, check=True,
                                      capture_output=True, text=True).stdout)
    experiments = [e for rev in shown for e in (rev.get("experiments") or [])]
    [exp] = [e for e in experiments if e.get("name") == exp_name]
    params = exp["revs"][0]["data"]["params"]["params/train.yaml"]["data"]["train"]
    assert params["b"]["lr"] == 0.5 and params["a"]["lr"] == 0.1

    client = MlflowClient()
    experiment = client.get_experiment_by_name(os.environ["STAR_EXPERIMENT"])
    [variant] = client.search_runs([experiment.experiment_id], "tags.`star.variant` = 'b-lr' and "
                                   "tags.mlflow.runName = 'b-lr'")
    stage_runs = client.search_runs([experiment.experiment_id],
                                    f"tags.mlflow.parentRunId = '{variant.info.run_id}'")
    assert [r.data.tags["dvc.stage"] for r in stage_runs] == ["train_b"]  # train_a did not re-run
    assert stage_runs[0].data.tags["dvc.exp_name"] == exp_name
    assert stage_runs[0].data.params["lr"] == "0.5"
