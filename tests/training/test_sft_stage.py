"""The base_model and sft stages end to end through `star`, logging to a real (temporary) MLflow store."""
from __future__ import annotations

import csv
import json

import pytest


def chat_record(i: int) -> dict:
    from components.travel.protocol import tool_response
    from components.travel.tools import COLUMNS, render_table

    city = ["Osk", "Tirrel", "Bram", "Vale"][i % 4]
    listing = render_table(f"Accommodations in {city} (1):", COLUMNS["SearchAccommodation"],
                           [{"NAME": f"Inn {i}", "price": 80 + i}])
    return {"messages": [
        {"role": "system", "content": "Plan trips with the tools.", "train": False},
        {"role": "user", "content": f"Find a hotel in {city}.", "train": False},
        {"role": "assistant", "content": f'<think>Hotels in {city}.</think><tool_call>{{"name": "SearchAccommodation", '
                                         f'"arguments": {{"city": "{city}"}}}}</tool_call>', "train": True},
        {"role": "user", "content": tool_response(listing), "train": False},
        {"role": "assistant", "content": f"<think>Inn {i} costs {80 + i}.</think><answer>Inn {i}, {city}</answer>",
         "train": True},
    ]}


def write_jsonl(path, records):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.mark.slow
def test_base_model_then_sft_write_checkpoints_metrics_and_mlflow_runs(small_model_factory, smol_tokenizer, tmp_path,
                                                                      monkeypatch):
    from mlflow.tracking import MlflowClient

    from components.cli import main
    from components.models.checkpoints import save_checkpoint
    from components.models.loading import load_policy_model

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("STAR_EXPERIMENT", "test-sft-stage")
    monkeypatch.delenv("STAR_PARENT_RUN_ID", raising=False)
    write_jsonl(tmp_path / "data/sft/train.jsonl", [chat_record(i) for i in range(24)])
    write_jsonl(tmp_path / "data/sft/eval.jsonl", [chat_record(i) for i in range(24, 28)])
    # A small random Llama with SmolLM2's tokenizer stands in for the pretrained checkpoint (the stage snapshots a
    # local checkpoint directory as it would the converted GGUF or a Hub download).
    save_checkpoint(small_model_factory(seed=0, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                        intermediate_size=64), smol_tokenizer, tmp_path / "pretrained")
    (tmp_path / "params").mkdir()
    (tmp_path / "params/model.yaml").write_text(f"model:\n  kind: pretrained\n  source: {tmp_path / 'pretrained'}\n")
    (tmp_path / "params/sft.yaml").write_text(
        "sft:\n  max_steps: 10\n  batch_size: 4\n  learning_rate: 0.01\n  eval_every: 5\n  cpu_threads: 1\n")

    assert main(["base-model", "--params", "params/model.yaml", "--out", "models/base"]) == 0
    assert main(["sft", "--params", "params/sft.yaml", "--model", "models/base", "--data", "data/sft",
                 "--out", "models/sft"]) == 0

    base = json.loads((tmp_path / "metrics/base_model.json").read_text())
    assert base["kind"] == "pretrained" and base["model_type"] == "llama" and base["vocab_size"] == len(smol_tokenizer)
    metrics = json.loads((tmp_path / "metrics/sft.json").read_text())
    assert metrics["steps"] == 10 and metrics["train_examples"] == 24 and metrics["eval_examples"] == 4
    assert metrics["train_records"] == 24 and metrics["dropped_overlong_or_empty"] == 0
    assert metrics["final_eval_loss"] < metrics["initial_eval_loss"]
    rows = list(csv.DictReader((tmp_path / "plots/sft/loss.csv").open()))
    assert [int(r["step"]) for r in rows] == list(range(1, 11))
    model = load_policy_model(tmp_path / "models/sft", device="cpu")
    assert model.config.model_type == "llama" and model.config.hidden_size == 32

    client = MlflowClient()
    experiment = client.get_experiment_by_name("test-sft-stage")
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert set(runs) == {"base_model", "sft"}
    assert runs["base_model"].data.tags["stats.vocab_size"] == str(len(smol_tokenizer))
    assert runs["base_model"].data.metrics == {}  # a data stage's one-off numbers are stats, not metrics
    history = client.get_metric_history(runs["sft"].info.run_id, "sft/train_loss")
    assert [m.step for m in history] == list(range(1, 11))
    assert runs["sft"].data.tags["stats.train_examples"] == "24"
    assert {d.dataset.name for d in runs["sft"].inputs.dataset_inputs} == {"train", "eval"}
    assert client.get_registered_model("star-sft").aliases == {"candidate": 1}
