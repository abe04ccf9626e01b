"""The Tool-Star branch's stages as dvc.yaml runs them: `star toolstar tasks`, `teach`, `eval`, and `star sft
--section toolstar_sft` on the expert's records, over a small generated QA corpus and an untrained checkpoint."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from components.cli import main
from components.agent.environment import trained_turn
from components.toolstar.params import ToolStarParams
from components.toolstar.evaluate import run_toolstar, summarize
from components.orchestration.presets import apply_preset
from components.params import load_section
from components.toolstar.sandbox import SandboxParams
from components.toolstar.splits import split_tasks
from components.toolstar.tasks import Task, TaskError, read_tasks
from components.agent.types import TurnPolicy

REPO = Path(__file__).resolve().parents[2]
SMALL_TOOLSTAR = {"toolstar": {
    "tasks": {"sft": {"multi_hop": 4, "compute": 2}, "val": {"multi_hop": 2, "compute": 2}},
    "eval": {"limits": {"max_turns": 2, "max_tokens_per_turn": 8}, "decoding": {"batch_size": 4}},
}}


@pytest.fixture(scope="module")
def qa_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """data/qa with a small generated encyclopedia (what `star qa build` writes there, corpus only)."""
    from components.qa.corpus import build_encyclopedia
    from components.qa.tasks import dump_jsonl

    qa = tmp_path_factory.mktemp("data") / "qa"
    encyclopedia = build_encyclopedia(num_people=30, num_towns=8, num_organisations=5, questions_per_dataset=1,
                                      seed=0)
    dump_jsonl([p.to_dict() for p in encyclopedia.passages], qa / "corpus.jsonl")
    return qa


@pytest.fixture
def params_file(tmp_path: Path) -> Path:
    path = tmp_path / "params" / "toolstar.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(SMALL_TOOLSTAR))
    return path


def task(i: int, kind: str = "compute") -> Task:
    return Task(id=f"t{i}", question=f"What is {i} + 1?", answer=str(i + 1), kind=kind)


# --- params and pure pieces -------------------------------------------------------------------------------------

def test_the_committed_params_are_valid_and_small_enough_for_the_tiny_preset(tmp_path):
    shutil.copytree(REPO / "params", tmp_path / "params")  # whichever preset the checkout has active, tiny's values
    apply_preset("tiny", tmp_path / "params")
    params = load_section(tmp_path / "params" / "toolstar.yaml", "toolstar", ToolStarParams)
    assert params.tasks.sft.total == 100 and params.tasks.val.total == 20
    assert params.max_tool_calls == 3 and params.sandbox.isolation == "bubblewrap" and params.retriever.top_k == 1
    assert params.eval.decoding.temperature == 0.0  # greedy: a reproducible evaluation


def test_the_validation_tasks_are_the_first_of_each_kind_and_the_rest_is_sft():
    tasks = [task(0, "multi_hop_arithmetic"), task(1), task(2, "multi_hop_arithmetic"), task(3), task(4)]
    sft, val = split_tasks(tasks, val_multi_hop=1, val_compute=2)
    assert [t.id for t in val] == ["t0", "t1", "t3"]
    assert [t.id for t in sft] == ["t2", "t4"]


def test_a_draw_too_small_for_the_validation_split_says_so():
    with pytest.raises(TaskError, match="too few tasks.*ask for fewer"):
        split_tasks([task(0)], val_multi_hop=1, val_compute=0)


def test_a_turn_the_environment_answered_with_an_error_is_kept_in_context_but_not_trained():
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
                {"role": "assistant", "content": "<search> no think </search>"},
                {"role": "user", "content": "Error: the turn has no <think> ... </think>"},
                {"role": "assistant", "content": "<think> t </think>\n<search> q </search>"},
                {"role": "user", "content": "<result>\nDoc\n</result>"},
                {"role": "assistant", "content": "<think> t </think>\n<answer> \\boxed{1} </answer>"}]
    assert [trained_turn(messages, i) for i in range(len(messages))] == [False, False, False, False, True, False, True]


# --- the stages -------------------------------------------------------------------------------------------------

def test_tasks_writes_disjoint_sft_and_validation_sets(qa_dir, params_file, tmp_path, tracking_store):
    out, metrics = tmp_path / "data" / "toolstar", tmp_path / "metrics" / "toolstar_tasks.json"
    assert main(["toolstar", "tasks", "--params", str(params_file), "--qa", str(qa_dir), "--out", str(out),
                 "--metrics", str(metrics)]) == 0
    sft, val = read_tasks(out / "sft.jsonl"), read_tasks(out / "val.jsonl")
    assert [len(sft), len(val)] == [6, 4]
    assert not {t.question for t in sft} & {t.question for t in val}
    assert not {t.id for t in sft} & {t.id for t in val}
    summary = json.loads(metrics.read_text())
    assert summary["val"]["by_kind"] == {"compute": 2, "multi_hop_arithmetic": 2} and summary["shared_questions"] == 0


def make_tasks(qa_dir: Path, params_file: Path, out: Path) -> Path:
    assert main(["toolstar", "tasks", "--params", str(params_file), "--qa", str(qa_dir), "--out", str(out),
                 "--metrics", str(out.parent / "tasks.json")]) == 0
    return out


def test_teach_writes_the_experts_solved_episodes_as_records_sft_can_train_on(
        qa_dir, params_file, tmp_path, tracking_store, bubblewrap, smol_tokenizer):
    from components.training.sft import build_examples, load_records

    tasks = make_tasks(qa_dir, params_file, tmp_path / "data" / "toolstar")
    records, metrics = tmp_path / "data" / "toolstar" / "sft_records", tmp_path / "metrics" / "sft_data.json"
    assert main(["toolstar", "teach", "--params", str(params_file), "--qa", str(qa_dir),
                 "--tasks", str(tasks / "sft.jsonl"), "--out", str(records), "--metrics", str(metrics)]) == 0

    summary = json.loads(metrics.read_text())
    assert summary["solve_rate"] == 1.0 and summary["kept"] == 6 and [summary["train"], summary["eval"]] == [5, 1]
    assert summary["by_kind"]["compute"]["tool_calls"] == {"search": 0.0, "python": 1.0, "total": 1.0}
    assert summary["by_kind"]["multi_hop_arithmetic"]["tool_calls"]["search"] >= 1.0
    assert summary["by_kind"]["multi_hop_arithmetic"]["mean_reward"] == pytest.approx(1.1)  # both tools: the bonus
    train = load_records(records / "train.jsonl") + load_records(records / "eval.jsonl")
    assert {r["level"] for r in train} == {"compute", "multi_hop_arithmetic"}
    assert all(m["train"] == (m["role"] == "assistant") for r in train for m in r["messages"])
    examples, dropped = build_examples(smol_tokenizer, train, cutoff_len=2048)
    assert dropped == 0 and len(examples) == 6
    for example, record in zip(examples, train):
        trained = smol_tokenizer.decode([t for t, m in zip(example.input_ids, example.mask) if m])
        assert "\\boxed{" in trained and "<result>" not in trained  # the answer is learned, tool results are not


def test_eval_scores_a_checkpoints_episodes_by_task_kind(qa_dir, params_file, tiny_checkpoint, tmp_path,
                                                         tracking_store, bubblewrap, capsys):
    tasks = make_tasks(qa_dir, params_file, tmp_path / "data" / "toolstar")
    out, records = tmp_path / "metrics" / "toolstar" / "base.json", tmp_path / "eval" / "base.jsonl"
    assert main(["toolstar", "eval", "--params", str(params_file), "--model", str(tiny_checkpoint), "--name", "base",
                 "--qa", str(qa_dir), "--tasks", str(tasks / "val.jsonl"), "--out", str(out),
                 "--records", str(records)]) == 0

    metrics = json.loads(out.read_text())
    assert {"n", "accuracy", "mean_reward", "reward_positive_rate", "format_ok_rate", "answer_rate", "em", "f1",
            "tool_calls", "code_errors", "sandbox_kills", "format_errors", "refused_calls", "termination",
            "by_kind", "checkpoint", "model"} <= set(metrics)
    assert metrics["n"] == 4 and metrics["checkpoint"] == "base"
    assert set(metrics["by_kind"]) == {"compute", "multi_hop_arithmetic"}
    assert metrics["accuracy"] == 0.0 and metrics["mean_reward"] == -1.0  # an untrained model answers nothing
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    assert len(lines) == 4 and all("prompt_ids" in r and "evaluation" in r and r["golden_answer"] for r in lines)
    assert "base: accuracy 0.0%" in capsys.readouterr().out


@pytest.mark.slow
def test_star_sft_trains_on_the_toolstar_records_from_its_own_params_section(
        qa_dir, params_file, tiny_checkpoint, tmp_path, tracking_store, bubblewrap):
    from mlflow.tracking import MlflowClient

    tasks = make_tasks(qa_dir, params_file, tmp_path / "data" / "toolstar")
    records = tmp_path / "data" / "toolstar" / "sft_records"
    assert main(["toolstar", "teach", "--params", str(params_file), "--qa", str(qa_dir),
                 "--tasks", str(tasks / "sft.jsonl"), "--out", str(records),
                 "--metrics", str(tmp_path / "sft_data.json")]) == 0
    sft_params = params_file.parent / "toolstar_sft.yaml"
    sft_params.write_text("toolstar_sft:\n  max_steps: 2\n  eval_every: 1\n  cpu_threads: 1\n")
    assert main(["sft", "--params", str(sft_params), "--section", "toolstar_sft", "--model", str(tiny_checkpoint),
                 "--data", str(records), "--out", str(tmp_path / "models" / "toolstar_sft"),
                 "--metrics", str(tmp_path / "toolstar_sft.json"),
                 "--plots", str(tmp_path / "plots" / "loss.csv")]) == 0

    assert (tmp_path / "models" / "toolstar_sft" / "model.safetensors").exists()
    assert json.loads((tmp_path / "toolstar_sft.json").read_text())["train_examples"] == 5
    client = MlflowClient(tracking_store)
    assert client.get_registered_model("star-toolstar-sft").name == "star-toolstar-sft"
    names = {run.data.tags.get("star.stage") for run in client.search_runs(
        [e.experiment_id for e in client.search_experiments()])}
    assert {"toolstar_tasks", "toolstar_sft_data", "toolstar_sft"} <= names


# --- the metrics over real episodes -----------------------------------------------------------------------------

class ScriptedPolicy(TurnPolicy):
    """Each episode's n-th assistant turn is `turns[n]`."""

    def __init__(self, turns: list[str]):
        self.turns = turns

    def generate(self, requests):
        from components.agent.types import TurnResult

        return [TurnResult(text=self.turns[sum(m["role"] == "assistant" for m in r.messages)]) for r in requests]


def test_the_metrics_count_format_errors_code_errors_sandbox_kills_and_tools(bubblewrap):
    from components.agent.loop import Limits

    class Nothing:
        def search(self, query):
            return []

    from components.toolstar.sandbox import Sandbox

    sandbox = Sandbox(SandboxParams(cpu_seconds=1, wall_seconds=3))
    turns = ["no tags at all",
             "<think> t </think>\n<python>\n1 / 0\n</python>",
             "<think> t </think>\n<python>\nwhile True:\n    pass\n</python>",
             "<think> t </think>\n<search> q </search>",
             "<think> t </think>\n<answer> The final answer is \\boxed{1} </answer>"]
    params = ToolStarParams(max_tool_calls=3)
    records = run_toolstar([task(0)], Nothing(), sandbox, ScriptedPolicy(turns), params, Limits(max_turns=8),
                           progress=False)
    metrics = summarize(records)
    assert metrics["format_errors"] == 1 and metrics["code_errors"] == 2 and metrics["sandbox_kills"] == 1
    assert metrics["tool_calls"] == {"search": 1.0, "python": 2.0, "total": 3.0}
    assert metrics["accuracy"] == 1.0 and metrics["em"] == 1.0  # the answer is right ...
    assert metrics["mean_reward"] == pytest.approx(1.1)  # ... the format passes (the error message is not part of
    # Tool-Star's response), and both tools ran
    assert metrics["by_kind"]["compute"]["n"] == 1 and metrics["termination"] == {"answer": 1}
