"""components.tracking: where runs go, what they carry, and that secrets never reach MLflow."""
from __future__ import annotations

import json

import pytest

from components import tracking


def test_flatten_gives_dotted_keys_for_nested_params():
    from pydantic import BaseModel

    class Reward(BaseModel):
        kind: str = "sum"

    class RL(BaseModel):
        epochs: int = 5
        reward: Reward = Reward()
        days: tuple[int, ...] = (3, 5)

    assert tracking.flatten(RL()) == {"epochs": 5, "reward.kind": "sum", "days": [3, 5]}
    assert tracking.flatten({"a": {"b": [{"c": 1}]}}) == {"a.b.0.c": 1}


@pytest.mark.parametrize("key", ["api_key", "endpoint.apiKey", "hf_token", "aws_secret_access_key", "password",
                                 "db.credentials", "OPENAI_API_KEY", "MLFLOW_TRACKING_TOKEN"])
def test_secret_key_names(key):
    assert tracking.is_secret_key(key)


@pytest.mark.parametrize("key", ["max_new_tokens", "tokenizer.vocab_size", "api_key_env_name_is_fine_not",
                                 "monkey", "secretary_count"])
def test_ordinary_key_names(key):
    expected = key == "api_key_env_name_is_fine_not"  # contains the word `key`: redacted, better safe
    assert tracking.is_secret_key(key) is expected


def test_redact_hides_secret_keys_env_secret_values_and_url_passwords():
    environ = {"OPENAI_API_KEY": "sk-live-123456", "HOME": "/root"}
    clean = tracking.redact({"teacher.api_key": "sk-other", "teacher.note": "uses sk-live-123456 today",
                             "teacher.base_url": "https://user:pw@llm.example.com/v1", "epochs": 6,
                             "max_new_tokens": 512, "teacher.api_key_env": "OPENAI_API_KEY"}, environ)
    assert clean == {"teacher.api_key": "***", "teacher.note": "uses *** today",
                     "teacher.base_url": "https://***@llm.example.com/v1", "epochs": "6", "max_new_tokens": "512",
                     "teacher.api_key_env": "***"}


def test_params_logged_to_mlflow_hide_url_passwords_and_tokens_wherever_they_sit():
    params = {"ood_qa": {"retriever": {"url": "http://retriever:8000/retrieve?token=tok-123&topk=3"}},
              "teacher": {"endpoint": {"base_url": "http://bob:s3cret@llm:8000/v1"}},
              "notes": ["see http://alice:pw-456@llm/v1"]}
    clean = tracking.redact(tracking.flatten(params), environ={})
    assert clean == {"ood_qa.retriever.url": "http://retriever:8000/retrieve?token=***&topk=3",
                     "teacher.endpoint.base_url": "http://***@llm:8000/v1",
                     "notes": '["see http://***@llm/v1"]'}


def test_repo_root_maps_a_dvc_temp_experiment_copy_back_to_the_project(tmp_path, monkeypatch):
    monkeypatch.setenv("DVC_ROOT", str(tmp_path / "proj" / ".dvc" / "tmp" / "exps" / "tmpab12"))
    assert tracking.repo_root() == tmp_path / "proj"
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking.tracking_uri() == f"sqlite:///{tmp_path / 'proj' / 'mlflow.db'}"


def test_tracking_uri_prefers_the_environment(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5555")
    assert tracking.tracking_uri() == "http://127.0.0.1:5555"


def test_experiment_is_named_after_the_preset(tmp_path, monkeypatch):
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    (tmp_path / "params").mkdir()
    (tmp_path / "params" / "preset.yaml").write_text("preset: qwen2.5-7b\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    monkeypatch.delenv(tracking.EXPERIMENT_ENV, raising=False)
    monkeypatch.delenv(tracking.PRESET_ENV, raising=False)
    assert tracking.experiment_name() == "star-qwen2.5-7b"
    monkeypatch.setenv(tracking.EXPERIMENT_ENV, "ablation-rewards")
    assert tracking.experiment_name() == "ablation-rewards"


@pytest.fixture
def sqlite_store(tmp_path, monkeypatch, mlflow_db):
    """A fresh project folder with its own (pre-migrated) sqlite MLflow store."""
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    monkeypatch.chdir(tmp_path)
    for name in ("DVC_ROOT", "DVC_STAGE", "DVC_EXP_NAME", tracking.PARENT_RUN_ENV, tracking.EXPERIMENT_ENV,
                 tracking.PRESET_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{mlflow_db}")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env-secret-987654")
    return tmp_path


def test_stage_runs_nest_under_the_pipeline_run_with_params_metrics_artifacts_and_models(sqlite_store, monkeypatch):
    from mlflow.tracking import MlflowClient

    (sqlite_store / "model").mkdir()
    (sqlite_store / "model" / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (sqlite_store / "loss.csv").write_text("step,loss\n0,1.0\n")
    with tracking.pipeline_run("pipeline", params={"stages": ["sft"]}) as parent:
        monkeypatch.setenv(tracking.PARENT_RUN_ENV, parent.run_id)
        monkeypatch.setenv("DVC_STAGE", "sft")
        with tracking.stage_run("sft", params={"sft": {"epochs": 3, "api_key": "sk-param-secret"}}) as run:
            for step, loss in enumerate([1.0, 0.5, 0.25]):
                run.log_metrics({"train": {"loss": loss}}, step=step)
            run.log_artifact(sqlite_store / "loss.csv", artifact_path="plots")
            version = run.log_model(sqlite_store / "model", registered_name="star-sft")
        parent.record_stage("sft", "ran", lock_hash="f" * 64, seconds=2.5)
    client = MlflowClient()
    child = client.get_run(run.run_id)
    assert child.data.tags["mlflow.parentRunId"] == parent.run_id
    assert child.data.tags["dvc.stage"] == "sft" and child.data.tags["dvc.lock_hash"] == "f" * 64
    assert child.data.params == {"sft.epochs": "3", "sft.api_key": "***"}
    assert [m.value for m in client.get_metric_history(run.run_id, "train.loss")] == [1.0, 0.5, 0.25]
    assert [m.step for m in client.get_metric_history(run.run_id, "train.loss")] == [0, 1, 2]
    assert {a.path for a in client.list_artifacts(run.run_id)} == {"plots", "model"}
    assert version == 1
    assert int(client.get_model_version_by_alias("star-sft", "candidate").version) == 1
    top = client.get_run(parent.run_id)
    assert top.data.tags["stage.sft.status"] == "ran" and top.info.status == "FINISHED"
    assert child.info.status == "FINISHED"
    everything = json.dumps([child.data.params, child.data.tags, top.data.params, top.data.tags])
    assert "sk-param-secret" not in everything and "sk-env-secret-987654" not in everything


def test_a_failing_stage_ends_its_run_failed(sqlite_store):
    from mlflow.tracking import MlflowClient

    with pytest.raises(RuntimeError, match="boom"):
        with tracking.stage_run("rl") as run:
            raise RuntimeError("boom")
    assert MlflowClient().get_run(run.run_id).info.status == "FAILED"
    assert MlflowClient().get_experiment(run.experiment_id).name == "star"


def test_log_model_refuses_a_folder_that_is_not_a_model(sqlite_store, tmp_path):
    with tracking.stage_run("sft") as run:
        with pytest.raises(FileNotFoundError, match="no config.json"):
            run.log_model(tmp_path)


def test_a_stage_run_leaves_the_process_tracking_uri_as_it_found_it(sqlite_store, monkeypatch, tmp_path):
    import mlflow

    other = f"sqlite:///{tmp_path / 'other.db'}"
    with tracking.stage_run("sft"):
        assert mlflow.get_tracking_uri() == tracking.tracking_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", other)  # a later test, or a notebook, points somewhere else
    assert mlflow.get_tracking_uri() == other


_OPEN_STAGE_RUN = """
import sys, time
from components import tracking
start = float(sys.argv[1])
time.sleep(max(0.0, start - time.time()))  # every process reaches the fresh store at the same moment
with tracking.stage_run(sys.argv[2]) as run:
    run.log_metrics({"x": 1.0}, step=0)
"""


def test_stage_processes_started_together_on_a_fresh_sqlite_store_all_log(tmp_path, monkeypatch):
    """Two `star` stages started at once used to race MLflow's schema migrations (`duplicate column name: step`)."""
    import subprocess
    import sys
    import time

    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("STAR_EXPERIMENT", "race")
    monkeypatch.delenv(tracking.PARENT_RUN_ENV, raising=False)
    start = time.time() + 8.0  # after every interpreter has imported mlflow
    procs = [subprocess.Popen([sys.executable, "-c", _OPEN_STAGE_RUN, str(start), f"stage{i}"], cwd=tmp_path,
                              stderr=subprocess.PIPE, text=True) for i in range(3)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], "\n".join(errors)
    runs = MlflowClient(uri).search_runs([tracking.ensure_experiment("race")])
    assert sorted(r.info.run_name for r in runs) == ["stage0", "stage1", "stage2"]
    assert tracking.sqlite_path(uri) == tmp_path / "mlflow.db"
    assert tracking.sqlite_path("http://127.0.0.1:5000") is None
