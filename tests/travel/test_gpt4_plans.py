"""The 180 GPT-4-Turbo validation plans: messy real-world output that must parse and score without a crash.

Their structured queries are not in the shared data, so each plan is scored against a synthetic query of the same
length that starts where the plan starts (only robustness and mode differences are asserted, not pass rates).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.travel.evaluate import COMMONSENSE_CHECKS, HARD_CHECKS, evaluate_plan
from components.travel.plans import current_cities, parse_plan
from components.travel.tasks import Query

CONSTRAINTS = {"house rule": "pets", "cuisine": ["Chinese", "Italian"], "room type": "entire room",
               "transportation": "no flight"}


@pytest.fixture(scope="module")
def gpt4_rows(shared_data: Path) -> list[dict]:
    path = shared_data / "fixtures" / "validation_gpt4_plans.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def matching_query(idx: int, plan: list[dict] | None) -> Query:
    """A hard query whose length is the plan's (nearest of 3/5/7) and whose origin is the plan's first city."""
    days = min((3, 5, 7), key=lambda d: abs(d - len(plan))) if plan else 3
    cities = current_cities(plan[0].get("current_city")) if plan else None
    return Query(idx=idx, org=cities[0] if cities else "Washington", dest="Texas", days=days,
                 visiting_city_number={3: 1, 5: 2, 7: 3}[days],
                 date=tuple(f"2022-03-{10 + d}" for d in range(days)), people_number=3,
                 local_constraint=CONSTRAINTS, budget=5000, level="hard")


def test_every_plan_parses_or_says_why(gpt4_rows):
    assert len(gpt4_rows) == 180
    parsed = [parse_plan(row["plan"]) for row in gpt4_rows]
    assert sum(plan is not None for plan, _ in parsed) == 161
    assert all(error == "no plan given" for plan, error in parsed if plan is None)
    assert all("days" in day and "day" not in day for plan, _ in parsed if plan for day in plan)


@pytest.mark.parametrize("normalize", [True, False])
def test_every_plan_scores_in_both_modes_without_raising(real_world, gpt4_rows, normalize):
    sandbox_passes = {"official": 0, "strict": 0}
    for row in gpt4_rows:
        plan, _ = parse_plan(row["plan"], normalize=normalize)
        query = matching_query(row["idx"], plan)
        for mode in sandbox_passes:
            evaluation = evaluate_plan(real_world, query, plan, mode)
            assert evaluation.delivered == (plan is not None)
            assert set(evaluation.commonsense) == set(COMMONSENSE_CHECKS)
            assert set(evaluation.hard) == set(HARD_CHECKS)
            json.dumps(evaluation.to_dict())
            sandbox_passes[mode] += evaluation.commonsense["is_valid_information_in_sandbox"].passed
    # Strict rejects what official lets through ("Rental Car", dateless flights, unchecked last attractions).
    assert sandbox_passes["strict"] < sandbox_passes["official"]


def test_rental_car_plans_show_the_official_transport_hole(real_world, gpt4_rows):
    hacked = [row for row in gpt4_rows if row["plan"] and
              any(str(day.get("transportation", "")).startswith("Rental Car") for day in row["plan"])]
    assert hacked
    for row in hacked:
        plan, _ = parse_plan(row["plan"])
        strict = evaluate_plan(real_world, matching_query(row["idx"], plan), plan, "strict")
        assert strict.commonsense["is_valid_information_in_sandbox"].failed
