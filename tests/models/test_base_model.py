"""The base_model stage: the tiny base is built from the pipeline's corpus and pre-trained on QA trajectories;
without the QA data it stops with a message that says which stage to run."""
from __future__ import annotations

import json

import pytest

from components.params import ParamsError, parse_section


def qa_record(i: int) -> dict:
    """A QA-with-search trajectory as a pre-training record (search, read the passage, answer)."""
    from components.travel.protocol import tool_response

    name, town = f"Ama Volen {i}", ["Osk", "Tirrel", "Bram"][i % 3]
    return {"messages": [
        {"role": "system", "content": "Answer with the search tool.", "train": False},
        {"role": "user", "content": f"Where was {name} born?", "train": False},
        {"role": "assistant", "content": f'<think>Search {name}.</think><tool_call>{{"name": "search", '
                                         f'"arguments": {{"query": "{name}"}}}}</tool_call>', "train": True},
        {"role": "user", "content": tool_response(f"(Title: {name}) {name} was born in {town}."), "train": False},
        {"role": "assistant", "content": f"<think>The passage says {town}.</think><answer>{town}</answer>",
         "train": True},
    ]}


def write_jsonl(path, records):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def tiny_params(**pretrain):
    from components.models.params import ModelParams

    return ModelParams.model_validate({
        "tokenizer": {"vocab_size": 400},
        "architecture": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1,
                         "intermediate_size": 64, "max_position_embeddings": 512},
        "pretrain": {"max_steps": 12, "learning_rate": 0.005, "batch_size": 4, "eval_every": 6,
                     "cpu_threads": 1, **pretrain},
        "pretrain_eval_fraction": 0.2,
    })


def test_missing_qa_data_stops_the_stage_with_the_command_to_run(tmp_path, capsys):
    from components.cli import main

    write_jsonl(tmp_path / "data/sft/train.jsonl", [qa_record(0)])
    (tmp_path / "model.yaml").write_text("model:\n  kind: tiny\n")
    code = main(["base-model", "--params", str(tmp_path / "model.yaml"), "--corpus", str(tmp_path / "data/sft"),
                 "--qa", str(tmp_path / "data/qa"), "--out", str(tmp_path / "models/base")])
    assert code == 2
    assert "qa_data" in capsys.readouterr().err
    assert not (tmp_path / "models/base").exists()


def test_tiny_base_is_built_pretrained_and_loadable(tmp_path):
    from components.models.commands import build_tiny_base
    from components.models.loading import load_policy_model, load_tokenizer

    records = [qa_record(i) for i in range(30)]
    summary, history = build_tiny_base(tiny_params(), corpus=records[:5], qa_records=records, out=tmp_path / "base")
    assert summary["kind"] == "tiny" and summary["pretrain_train_examples"] == 24 and summary["pretrain_eval_examples"] == 6
    assert summary["pretrain"]["final_eval_loss"] < summary["pretrain"]["initial_eval_loss"]
    assert len(history) == 12
    tokenizer = load_tokenizer(tmp_path / "base")
    assert tokenizer.convert_tokens_to_ids("<tool_call>") != tokenizer.unk_token_id
    model = load_policy_model(tmp_path / "base", device="cpu")
    assert model.config.hidden_size == 32 and model.config.vocab_size == len(tokenizer)


def test_pretrained_kind_needs_a_checkpoint_name():
    from components.models.params import ModelParams

    with pytest.raises(ParamsError, match="name_or_path"):
        parse_section({"model": {"kind": "pretrained"}}, "model", ModelParams)
    params = parse_section({"model": {"kind": "pretrained", "name_or_path": "Qwen/Qwen2.5-1.5B-Instruct"}},
                           "model", ModelParams)
    assert params.name_or_path == "Qwen/Qwen2.5-1.5B-Instruct"


def test_pretrained_base_is_a_snapshot_of_a_local_checkpoint(tiny_model, tiny_tokenizer, tmp_path):
    from components.models.checkpoints import save_checkpoint
    from components.models.commands import snapshot_base
    from components.models.params import ModelParams

    save_checkpoint(tiny_model, tiny_tokenizer, tmp_path / "qwen")
    params = ModelParams(kind="pretrained", name_or_path=str(tmp_path / "qwen"))
    summary = snapshot_base(params, tmp_path / "base")
    assert summary["model_type"] == "qwen2" and summary["vocab_size"] == len(tiny_tokenizer)
    assert (tmp_path / "base" / "model.safetensors").exists()


def test_copy_warm_up_trains_on_copy_records_first_then_the_mix_on_one_step_axis(tmp_path):
    from components.models.commands import build_tiny_base

    from components.synthesis.copy_task import CopyTaskParams

    params = tiny_params().model_copy(update={"pretrain_copy": CopyTaskParams(records=20, warmup_max_steps=7,
                                                                                 warmup_minutes=1.0, seed=1)})
    records = [qa_record(i) for i in range(30)]
    logged_steps = []
    summary, history = build_tiny_base(params, corpus=records[:5], qa_records=records, out=tmp_path / "base",
                                       on_log=lambda metrics, step: logged_steps.append(step))
    assert summary["copy_records"] == 20
    assert summary["pretrain_train_examples"] == 24 + 16 and summary["pretrain_eval_examples"] == 6 + 4
    warmup = summary["copy_warmup"]
    assert warmup["steps"] == 7 and warmup["final_eval_loss"] < warmup["initial_eval_loss"]  # its own step budget
    assert [row["phase"] for row in history] == ["copy warm-up"] * 7 + ["pretrain"] * 12
    assert [row["step"] for row in history] == sorted({row["step"] for row in history})
    assert logged_steps == sorted(set(logged_steps)) and max(logged_steps) > 7  # MLflow sees the same one axis


def test_a_warm_up_attempt_whose_copy_loss_misses_the_check_restarts_from_a_new_initialisation(tmp_path):
    from components.models.commands import build_tiny_base
    from components.synthesis.copy_task import CopyTaskParams

    unreachable = CopyTaskParams(records=20, warmup_max_steps=12, warmup_check=(6, 1e-4), warmup_attempts=3, seed=1)
    params = tiny_params().model_copy(update={"pretrain_copy": unreachable})
    records = [qa_record(i) for i in range(30)]
    summary, history = build_tiny_base(params, corpus=records[:5], qa_records=records, out=tmp_path / "base")
    attempts = summary["copy_warmup_attempts"]
    assert [(a["model_seed"], a["steps"], a["stopped"]) for a in attempts] == [
        (0, 6, "no_progress"), (1, 6, "no_progress"), (2, 12, "completed")]  # the last attempt runs to its end
    assert summary["copy_warmup"]["attempts"] == 3 and summary["copy_warmup"]["total_steps"] == 24
    warm = [row for row in history if row["phase"] == "copy warm-up"]
    assert [row["attempt"] for row in warm] == [1] * 6 + [2] * 6 + [3] * 12
    assert [row["step"] for row in history] == list(range(1, len(history) + 1))  # one step axis for the plot


def test_a_warm_up_that_passes_its_check_is_not_restarted(tmp_path):
    from components.models.commands import build_tiny_base
    from components.synthesis.copy_task import CopyTaskParams

    easy = CopyTaskParams(records=20, warmup_max_steps=12, warmup_check=(6, 100.0), warmup_attempts=3, seed=1)
    params = tiny_params().model_copy(update={"pretrain_copy": easy})
    records = [qa_record(i) for i in range(30)]
    summary, _ = build_tiny_base(params, corpus=records[:5], qa_records=records, out=tmp_path / "base")
    assert [(a["attempt"], a["steps"], a["stopped"]) for a in summary["copy_warmup_attempts"]] == [(1, 12, "completed")]


def test_a_progress_check_between_eval_steps_is_refused():
    from components.training.sft import SFTParams

    with pytest.raises(ValueError, match="multiple of eval_every"):
        SFTParams(eval_every=100, progress_check=(150, 1.0))


def test_route_rounds_join_the_qa_mix_but_not_the_copy_warm_up(tmp_path, monkeypatch):
    import components.training.sft as sft
    from components.models.commands import build_tiny_base
    from components.synthesis.copy_task import CopyTaskParams

    seen = {}
    real_run_sft = sft.run_sft

    def recording_run_sft(model, tokenizer, train, evaluation, params, out, **kwargs):
        phase = (kwargs.get("manifest") or {}).get("phase", "pretrain")
        texts = [tokenizer.decode(example.input_ids) for example in [*train, *evaluation]]
        seen[phase] = sum("Route:" in text for text in texts)
        return real_run_sft(model, tokenizer, train, evaluation, params, out, **kwargs)

    monkeypatch.setattr(sft, "run_sft", recording_run_sft)
    copy = CopyTaskParams(records=20, warmup_max_steps=6, route_fraction=0.5, seed=1)
    params = tiny_params().model_copy(update={"pretrain_copy": copy})
    records = [qa_record(i) for i in range(30)]
    summary, _ = build_tiny_base(params, corpus=records[:5], qa_records=records, out=tmp_path / "base")
    assert seen["copy warm-up"] == 0 and seen["pretrain"] > 0
    assert {"sequential", "route"} <= set(summary["copy_accuracy"])  # the probe of route answers


def test_the_tokenizer_corpus_leaves_out_unknown_city_hints_and_nothing_else():
    from components.models.base import chat_texts, tokenizer_texts

    error = "Unknown city 'Pala' (SearchRestaurant). Use an exact city name; SearchCity(state) lists the cities of a state."
    records = [{"messages": [{"role": "user", "content": "Trip from Palavi to Gortu."},
                             {"role": "user", "content": f"<tool_response>\n{error} Did you mean Palavi or Palathal?\n"
                                                         "</tool_response>"}]}]
    assert list(tokenizer_texts(records)) == ["Trip from Palavi to Gortu.", f"<tool_response>\n{error}\n</tool_response>"]
    assert len(list(chat_texts(records))) == 2


def test_copy_replay_belongs_to_the_sft_stage_not_the_base_pretraining():
    from components.models.params import ModelParams

    with pytest.raises(ValueError, match="model.pretrain_copy"):
        ModelParams(pretrain={"copy_replay": {"records": 10}})
