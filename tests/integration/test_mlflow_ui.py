"""What a user of the MLflow UI finds after the smoke pipeline: read through the REST API of a real tracking server
(artifacts proxied to S3), the way the UI reads it."""
from __future__ import annotations

import pytest
import requests

from integration.conftest import SMOKE_EXPERIMENT

# the shared smoke `dvc repro` (conftest.py) may start here: ~6 minutes on 2 cores, over the suite's 600 s
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(60 * 60)]

# The stages whose one-point metrics are results (each a bar to compare checkpoints by), not statistics.
EVALUATION_STAGES = ("validate", "ood_qa", "toolstar_eval")


class Rest:
    """MLflow's REST API (`/api/2.0/mlflow/...`), as the UI calls it."""

    def __init__(self, url: str):
        self.url = url

    def get(self, path: str, **params) -> dict:
        response = requests.get(f"{self.url}/api/2.0/mlflow/{path}", params=params, timeout=30)
        response.raise_for_status()
        return response.json()

    def post(self, path: str, body: dict) -> dict:
        response = requests.post(f"{self.url}/api/2.0/mlflow/{path}", json=body, timeout=30)
        response.raise_for_status()
        return response.json()

    def runs(self, experiment_id: str) -> list[dict]:
        return self.post("runs/search", {"experiment_ids": [experiment_id], "max_results": 1000})["runs"]

    def history(self, run_id: str, key: str) -> list[dict]:
        return self.get("metrics/get-history", run_id=run_id, metric_key=key).get("metrics", [])


def by_key(entries: list[dict] | None) -> dict[str, str]:
    return {entry["key"]: entry["value"] for entry in entries or []}


@pytest.fixture(scope="module")
def smoke_experiment(smoke_project, mlflow_server):
    """The shared smoke project's experiment (conftest.py: `smoke_project`), its runs read before any other test
    adds runs of its own."""
    rest = Rest(mlflow_server)
    experiment = rest.get("experiments/get-by-name", experiment_name=SMOKE_EXPERIMENT)["experiment"]
    runs = rest.runs(experiment["experiment_id"])
    return rest, experiment, {run["info"]["run_name"]: run for run in runs}


def test_the_experiment_opens_in_the_model_training_view_with_a_description(smoke_experiment):
    _, experiment, _ = smoke_experiment
    tags = by_key(experiment["tags"])
    assert tags["mlflow.experimentKind"] == "custom_model_development"
    assert tags["mlflow.note.content"].startswith("STAR pipeline experiment `ui-smoke`")


def test_metrics_are_named_by_stage_and_only_evaluations_log_one_point_results(smoke_experiment):
    rest, _, runs = smoke_experiment
    for name, run in runs.items():
        if name == "dvc repro":
            continue
        stage = run["info"]["run_name"]  # the stage, with its checkpoint: validate@sft
        kind, _, checkpoint = stage.partition("@")
        section = {"toolstar_eval": "toolstar"}.get(kind, kind)
        prefix = f"{section}/{checkpoint}/" if checkpoint else f"{section}/"
        for metric in run["data"].get("metrics", []):
            key = metric["key"]
            if key.startswith("system/"):
                continue
            assert key.startswith(prefix), (stage, key)
            points = rest.history(run["info"]["run_id"], key)
            one_off = len(points) == 1 and int(points[0].get("step", 0)) == 0
            assert not one_off or kind in EVALUATION_STAGES, f"{stage}: {key} is a one-point metric"
    world_tags = by_key(runs["world"]["data"]["tags"])
    assert int(world_tags["stats.rows.accommodations"]) > 0 and not runs["world"]["data"].get("metrics")


def test_the_parent_run_holds_the_pipeline_params_and_every_checkpoints_headline_metrics(smoke_experiment):
    _, _, runs = smoke_experiment
    parent = runs["dvc repro"]["data"]
    params, metrics = by_key(parent["params"]), {m["key"]: m["value"] for m in parent["metrics"]}
    assert params["preset"] == "smoke" and params["rl.algorithm"] and params["sft.max_steps"] == "6"
    for checkpoint in ("base", "sft", "rl"):
        assert f"validate/{checkpoint}/final_pass" in metrics and f"ood_qa/{checkpoint}/em" in metrics
    assert "ood_qa/rl/tax" in metrics and "toolstar/rl/accuracy" in metrics


def test_the_training_runs_have_system_metrics_and_dataset_inputs(smoke_experiment):
    _, _, runs = smoke_experiment
    for name in ("sft", "rl", "toolstar_sft", "toolstar_rl"):
        keys = {m["key"] for m in runs[name]["data"]["metrics"]}
        assert {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"} <= keys, name
        inputs = runs[name]["inputs"]["dataset_inputs"]
        assert inputs and all(len(i["dataset"]["digest"]) == 32 for i in inputs), name
    [train] = [i["dataset"] for i in runs["sft"]["inputs"]["dataset_inputs"] if i["dataset"]["name"] == "train"]
    assert train["source_type"] == "dvc" and '"dvc_output": "data/sft"' in train["source"]


def test_the_registered_checkpoint_loads_with_the_transformers_flavour(smoke_experiment, mlflow_server,
                                                                       monkeypatch):
    import mlflow

    rest, _, runs = smoke_experiment
    version = rest.get("registered-models/alias", name="star-sft", alias="candidate")["model_version"]
    tags = by_key(version.get("tags"))
    assert version["run_id"] == runs["sft"]["info"]["run_id"] and tags["star.source_run"] == version["run_id"]
    assert tags["star.dataset.train"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    pipe = mlflow.transformers.load_model("models:/star-sft@candidate")
    assert type(pipe).__name__ == "TextGenerationPipeline" and pipe.tokenizer.chat_template


def test_no_artifact_uri_is_a_path_of_the_machine_that_ran_the_stage(smoke_experiment):
    _, experiment, runs = smoke_experiment
    assert experiment["artifact_location"].startswith("mlflow-artifacts:")
    for name, run in runs.items():
        assert run["info"]["artifact_uri"].startswith("mlflow-artifacts:"), name


def test_an_ordinary_number_is_not_redacted(smoke_experiment):
    _, _, runs = smoke_experiment
    assert by_key(runs["sft_data"]["data"]["params"])["chars_per_token"] == "4.2"


def test_the_rl_run_on_the_engine_logs_the_mismatch_and_the_sync_at_every_step(smoke_experiment, smoke_project):
    """The smoke rl stage's rollouts run on the vLLM engine (`rollout.backend: auto`, .venv-engine built by
    ./scripts/bootstrap.sh): every step pushes the weights to it and measures how far its log-probs are from the
    trainer's."""
    if smoke_project[1]["STAR_ENGINE_PYTHON"] == "none":
        pytest.skip("no rollout engine environment (.venv-engine): ./scripts/bootstrap.sh builds it")
    rest, _, runs = smoke_experiment
    run_id = runs["rl"]["info"]["run_id"]
    steps = {key: {int(p["step"]): p["value"] for p in rest.history(run_id, f"rl/policy/{key}")}
             for key in ("logprob_mismatch", "weight_sync_s", "weight_sync_tensors")}
    assert sorted(steps["weight_sync_tensors"]) == [1, 2], steps  # the smoke preset's two steps
    assert all(tensors > 0 for tensors in steps["weight_sync_tensors"].values()), steps
    assert steps["weight_sync_s"].keys() == steps["logprob_mismatch"].keys() == steps["weight_sync_tensors"].keys()
    assert all(0 <= mismatch < 1e-4 for mismatch in steps["logprob_mismatch"].values()), steps
