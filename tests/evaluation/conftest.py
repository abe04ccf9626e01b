"""Shared fixtures for the evaluation tests: hand-made metrics files in the stage-contract shapes."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from components.evaluation.ood_qa import summarize
from components.evaluation.question_results import alignment_tax, with_tax
from components.travel.tasks import Query

COMMONSENSE = ["is_valid_information_in_current_city", "is_valid_information_in_sandbox",
               "is_reasonable_visiting_city", "is_valid_restaurants", "is_valid_attractions",
               "is_valid_transportation", "is_valid_accommodation", "is_not_absent"]
HARD = ["valid_cost", "valid_room_rule", "valid_room_type", "valid_cuisine", "valid_transportation"]


def mode_metrics(level: float) -> dict:
    """A plausible metrics block for one evaluator mode, scaled by `level` in [0, 1]."""
    per_check = {c: round(min(1.0, level * (0.6 + 0.05 * i)), 3) for i, c in enumerate(COMMONSENSE + HARD)}
    return {"delivery_rate": min(1.0, 0.5 + level), "commonsense_micro": 0.8 * level, "commonsense_macro": 0.5 * level,
            "hard_micro": 0.7 * level, "hard_macro": 0.4 * level, "final_pass": 0.3 * level, "per_check": per_check}


def question_results(dataset: str, right: int, n: int = 100, mode: str = "in_context") -> list[dict]:
    """Per-question OOD QA results of one dataset: the first `right` of `n` questions answered exactly (F1 1), the
    next five half right (F1 0.5), the rest wrong; question ids are the same for every checkpoint. The passages held
    the answer of the first `right + 5`."""
    def f1(i: int) -> float:
        return 1.0 if i < right else 0.5 if i < right + 5 else 0.0

    return [{"id": f"{dataset}-{i}", "dataset": dataset, "mode": mode, "em": float(i < right), "f1": f1(i),
             "answer": "x", "termination": "answer", "num_tool_calls": 0, "answer_in_context": i < right + 5}
            for i in range(n)]


def _easy_queries(world, n: int = 2) -> list[Query]:
    """Easy 3-day trips between cities of the tiny world."""
    cities = world.cities
    no_constraint = {"house rule": None, "cuisine": None, "room type": None, "transportation": None}
    return [Query(idx=i, org=cities[i], dest=cities[i + 4], days=3, visiting_city_number=1,
                  date=("2022-03-05", "2022-03-06", "2022-03-07"), people_number=1,
                  local_constraint=dict(no_constraint), budget=3000, level="easy",
                  query=f"Plan a 3-day trip from {cities[i]} to {cities[i + 4]} from March 5th to 7th, 2022, "
                        "for one person with a budget of $3,000.")
            for i in range(n)]


@pytest.fixture
def make_question_results():
    """`make_question_results(dataset, right, n=100, mode="in_context")`: per-question OOD QA results."""
    return question_results


@pytest.fixture
def make_queries():
    """`make_queries(world, n=2)`: easy 3-day trips between cities of a world."""
    return _easy_queries


@pytest.fixture
def metrics_tree(tmp_path: Path) -> tuple[Path, Path]:
    """metrics/ and plots/ for base, sft and rl, as the pipeline's stages write them."""
    metrics, plots = tmp_path / "metrics", tmp_path / "plots"
    (metrics / "validate").mkdir(parents=True)
    (metrics / "ood_qa").mkdir()
    (plots / "rl").mkdir(parents=True)
    questions = {}
    for name, level, em in [("base", 0.0, 0.42), ("sft", 0.6, 0.35), ("rl", 0.9, 0.31)]:
        (metrics / "validate" / f"{name}.json").write_text(json.dumps(
            {"n": 40, "strict": mode_metrics(level), "official": mode_metrics(min(1.0, level * 1.1)),
             "grounding": {"mean": 0.9 * level, "plans_with_entities": 40}}))
        questions[name] = [*question_results("single_hop", round(100 * (em + 0.1))),
                           *question_results("multi_hop", round(100 * (em - 0.1)))]
        ood = {"mode": "in_context", **summarize(questions[name])}
        if name != "base":
            ood = with_tax(ood, alignment_tax(questions["base"], questions[name]))
        (metrics / "ood_qa" / f"{name}.json").write_text(json.dumps(ood))
        (metrics / "ood_qa" / f"{name}.questions.jsonl").write_text(
            "".join(json.dumps(line) + "\n" for line in questions[name]))
    (metrics / "sft.json").write_text(json.dumps({"final_train_loss": 0.812, "epochs": 3, "tokens_per_s": 6510.0}))
    with (plots / "rl" / "rewards.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", "reward", "cs_micro", "hard_micro", "cs_macro", "hard_macro", "success"])
        for step in range(60):
            t = step / 60
            wiggle = 0.05 * math.sin(step)
            writer.writerow([step, 0.2 + 0.5 * t + wiggle, 0.5 + 0.4 * t, 0.4 + 0.4 * t + wiggle,
                             0.1 + 0.6 * t, 0.2 + 0.5 * t, 0.05 + 0.4 * t + wiggle])
    return metrics, plots


@pytest.fixture(scope="session")
def tiny_checkpoint(small_model_factory, smol_tokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained small Llama checkpoint (SmolLM2's tokenizer) saved like a pipeline stage saves one."""
    from components.models.checkpoints import save_checkpoint

    model = small_model_factory(seed=0, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                intermediate_size=64)
    return save_checkpoint(model, smol_tokenizer, tmp_path_factory.mktemp("tiny_checkpoint"), stage="test")


@pytest.fixture
def tracking_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A throw-away MLflow store for commands that open a stage run."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("STAR_PARENT_RUN_ID", raising=False)
    return uri
