"""Adding an environment: the `lookup` package beside this file and one registry line take a new environment
through the stages that reach environments by `env.kind`: SFT data from its expert, `star sft`, `star rl` and the
evaluation of the RL checkpoint (docs/architecture.md, "Add an environment")."""
from __future__ import annotations

import csv
import json

import pytest

from components import environments
from components.agent.environment import SourceInputs
from components.agent.loop import Limits
from fourth_env import source
from fourth_env.tasks import make_tasks, write_tasks

LIMITS = Limits(max_turns=3, max_tokens_per_turn=16, max_context_tokens=2048)


@pytest.fixture
def lookup(monkeypatch, tmp_path) -> SourceInputs:
    """The registry line (as a test adds it), and six lookup tasks."""
    monkeypatch.setitem(environments.ENVIRONMENTS, "lookup", lambda: source)
    return SourceInputs(tasks=write_tasks(make_tasks(6), tmp_path / "tasks.jsonl"))


def test_the_registered_expert_solves_every_task(lookup):
    from components.evaluation.environment import evaluate_policy

    records, metrics = evaluate_policy("lookup", lookup, environments.expert_policy("lookup"), LIMITS)
    assert metrics["solved_rate"] == 1.0 and metrics["checks"] == {"correct": 1.0}
    assert [r["num_tool_calls"] for r in records] == [1] * 6


def test_its_expert_episodes_become_sft_records_that_train_only_the_assistant_turns(lookup):
    from components.synthesis.expert_data import expert_sft_records

    records, counts = expert_sft_records("lookup", lookup, LIMITS)
    assert counts == {"episodes": 6, "solved": 6, "kept": 6, "dropped": {"unsolved": 0, "duplicate": 0}}
    roles = [(m["role"], m["train"]) for m in records[0]["messages"]]
    assert roles == [("system", False), ("user", False), ("assistant", True), ("user", False), ("assistant", True)]


@pytest.mark.slow
def test_the_lookup_game_goes_through_sft_data_sft_rl_and_evaluation(lookup, tmp_path, monkeypatch,
                                                                    small_model_factory, smol_tokenizer):
    from components.cli import main
    from components.evaluation.environment import evaluate_checkpoint
    from components.evaluation.policy import DecodingParams
    from components.models.checkpoints import save_checkpoint
    from components.synthesis.expert_data import expert_sft_records

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.delenv("STAR_PARENT_RUN_ID", raising=False)
    model = small_model_factory(seed=0, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                intermediate_size=64)
    base = save_checkpoint(model, smol_tokenizer, tmp_path / "models" / "base", stage="test")

    records, _ = expert_sft_records("lookup", lookup, LIMITS)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "sft.yaml").write_text("sft:\n  max_steps: 2\n  eval_every: 1\n  cpu_threads: 1\n")
    assert main(["sft", "--params", str(tmp_path / "sft.yaml"), "--model", str(base), "--data",
                 str(tmp_path / "data"), "--out", str(tmp_path / "models" / "sft"),
                 "--metrics", str(tmp_path / "sft.json"), "--plots", str(tmp_path / "sft_loss.csv")]) == 0

    (tmp_path / "rl.yaml").write_text(
        "rl:\n  env: {kind: lookup}\n  max_steps: 1\n  queries_per_step: 2\n  num_generations: 2\n"
        "  micro_batch_size: 2\n  rollout: {max_turns: 3, max_tokens_per_turn: 16, max_context_tokens: 2048}\n")
    plots = tmp_path / "plots" / "rl"
    assert main(["rl", "--params", str(tmp_path / "rl.yaml"), "--model", str(tmp_path / "models" / "sft"),
                 "--queries", str(lookup.tasks), "--out", str(tmp_path / "models" / "rl"),
                 "--checkpoints", str(tmp_path / "checkpoints"), "--metrics", str(tmp_path / "rl.json"),
                 "--plots", str(plots)]) == 0
    with (plots / "rewards.csv").open() as handle:
        reader = csv.DictReader(handle)
        assert reader.fieldnames == source.REWARD_COLUMNS and [row["step"] for row in reader] == ["1"]

    metrics = evaluate_checkpoint("lookup", lookup, tmp_path / "models" / "rl", DecodingParams(), LIMITS)
    assert metrics["n"] == 6 and 0.0 <= metrics["mean_reward"] <= 1.0 and set(metrics["checks"]) == {"correct"}
