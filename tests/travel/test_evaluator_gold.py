"""The 45 human gold plans of the training split, scored against the real database (the correctness anchor).

Annotators wrote them to satisfy every constraint, so the official evaluator passes all 45. Strict mode passes 44:
gold plan 41 sends the traveller to attractions in San Angelo (day 4) and Houston (day 5) while staying in
San Antonio; the official current-city check iterates the characters of "San Antonio" on those days and misses it.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from components.travel.evaluate import evaluate_plan
from components.travel.plans import parse_plan
from components.travel.tasks import load_queries

QUERIES = Path(__file__).resolve().parents[1] / "fixtures" / "train_queries.jsonl"

# Gold plans that strict mode rejects, with the defect that makes it right to.
STRICT_GOLD_DEFECTS = {
    41: ("is_valid_information_in_current_city", "San Angelo"),
}


@pytest.fixture(scope="module")
def gold(shared_data: Path) -> list[tuple]:
    """(query, parsed gold plan) for the 45 training queries."""
    queries = load_queries(QUERIES)
    lines = (shared_data / "fixtures" / "train_gold_plans_messages.jsonl").read_text().splitlines()
    pairs = []
    for query, line in zip(queries, lines):
        plan, error = parse_plan(json.loads(line)["messages"][2]["content"])
        assert error is None, f"gold plan {query.idx}: {error}"
        pairs.append((query, plan))
    assert len(pairs) == 45
    return pairs


def test_every_gold_plan_passes_the_official_evaluator(real_world, gold):
    failures = {}
    for query, plan in gold:
        evaluation = evaluate_plan(real_world, query, plan, "official")
        if not evaluation.final_pass:
            failures[query.idx] = {k: r.reason for k, r in {**evaluation.commonsense, **evaluation.hard}.items()
                                   if r.failed}
    assert failures == {}


def test_gold_plans_pass_strict_except_the_listed_genuine_defects(real_world, gold):
    failing = {}
    for query, plan in gold:
        evaluation = evaluate_plan(real_world, query, plan, "strict")
        if not evaluation.final_pass:
            failing[query.idx] = [(name, r.reason) for name, r in
                                  {**evaluation.commonsense, **evaluation.hard}.items() if r.failed]
    assert set(failing) == set(STRICT_GOLD_DEFECTS)
    for idx, (check, needle) in STRICT_GOLD_DEFECTS.items():
        assert [name for name, _ in failing[idx]] == [check]
        assert needle in failing[idx][0][1]


def test_gold_costs_stay_within_budget_and_match_between_modes(real_world, gold):
    query, plan = gold[0]  # St. Petersburg -> Rockford, 1 person, budget 1,700
    official = evaluate_plan(real_world, query, plan, "official")
    strict = evaluate_plan(real_world, query, plan, "strict")
    assert official.total_cost == strict.total_cost
    assert 0 < strict.total_cost <= query.budget


def test_star_evaluate_writes_metrics_and_per_plan_records(real_world_dir, shared_data, tmp_path, capsys):
    from components.travel import commands

    lines = (shared_data / "fixtures" / "train_gold_plans_messages.jsonl").read_text().splitlines()
    plans = tmp_path / "plans.jsonl"
    # Query 3's plan is left out on purpose: it must count as undelivered, not shrink N.
    plans.write_text("".join(json.dumps({"idx": i, "plan": json.loads(line)["messages"][2]["content"]}) + "\n"
                             for i, line in enumerate(lines) if i != 3))
    parser = argparse.ArgumentParser()
    commands.register(parser.add_subparsers())
    out = tmp_path / "metrics" / "gold.json"
    args = parser.parse_args(["evaluate", "--world", str(real_world_dir), "--queries", str(QUERIES),
                              "--plans", str(plans), "--mode", "both", "--out", str(out)])
    assert args.handler(args) == 0

    metrics = json.loads(out.read_text())
    assert metrics["n"] == 45
    assert metrics["official"]["delivery_rate"] == pytest.approx(44 / 45)
    assert metrics["official"]["final_pass"] == pytest.approx(44 / 45)
    assert metrics["strict"]["final_pass"] == pytest.approx(43 / 45)
    assert metrics["official"]["hard_micro"] == pytest.approx(104 / 105)  # 45 budgets + 60 local constraints
    records = [json.loads(line) for line in (tmp_path / "metrics" / "gold.plans.jsonl").read_text().splitlines()]
    assert [r["idx"] for r in records] == list(range(45))
    assert records[3]["evaluation"]["strict"]["delivered"] is False
    assert "Final pass rate" in capsys.readouterr().out


# ---- mutations: each gold plan broken in one way, with the check the public code's rules say must catch it ----

MEALS = ("breakfast", "lunch", "dinner")


def real_days(plan: list[dict]) -> list[dict]:
    return [day for day in plan if day]


def meal_slots(plan: list[dict]) -> list[tuple[int, str]]:
    return [(i, meal) for i, day in enumerate(real_days(plan)) for meal in MEALS if day.get(meal, "-") != "-"]


def invent_restaurant(plan, query):
    """A meal at a restaurant the database does not have: `is_valid_information_in_sandbox` looks it up."""
    (i, meal), *_ = meal_slots(plan)
    plan[i][meal] = "Imaginary Bistro Qzx, " + plan[i][meal].rsplit(",", 1)[-1].strip()
    return plan, query, "is_valid_information_in_sandbox"


def repeat_restaurant(plan, query):
    """The same restaurant twice: `is_valid_restaurants` rejects any repeat."""
    slots = meal_slots(plan)
    if len(slots) < 2:
        return None
    (i, a), (j, b) = slots[0], slots[-1]
    plan[j][b] = plan[i][a]
    return plan, query, "is_valid_restaurants"


def repeat_attraction(plan, query):
    """An attraction listed twice: `is_valid_attractions` rejects any repeat, within a day too."""
    day = next((d for d in real_days(plan) if d.get("attraction", "-") not in ("-", "")), None)
    if day is None:
        return None
    first = day["attraction"].split(";")[0]
    day["attraction"] = f"{day['attraction'].rstrip(';')};{first};"
    return plan, query, "is_valid_attractions"


def drop_last_day(plan, query):
    """One day short: `is_not_absent` first checks the number of days."""
    days = real_days(plan)
    return days[:-1], query, "is_not_absent"


def drive_one_flown_leg(plan, query):
    """Self-driving on one leg and a flight on another: `is_valid_transportation` forbids the mix."""
    days = real_days(plan)
    flights = [d for d in days if str(d.get("transportation", "")).startswith("Flight Number")]
    if len(flights) < 2:
        return None
    leg = flights[0]["current_city"]
    flights[0]["transportation"] = f"Self-driving, {leg}, duration: 1 hour, distance: 100 km, cost: 5"
    return plan, query, "is_valid_transportation"


def cut_the_budget(plan, query):
    """A budget of 1: `valid_cost` compares the total cost with it."""
    import dataclasses

    return plan, dataclasses.replace(query, budget=1), "valid_cost"


def ask_for_what_the_stay_forbids(plan, query, world):
    """A house rule the chosen stay forbids ("parties" at a "No parties" listing, as hard_constraint.py tests it):
    `valid_room_rule` fails."""
    import dataclasses

    for day in real_days(plan):
        if day.get("accommodation", "-") == "-":
            continue
        name, city = (part.strip() for part in day["accommodation"].rsplit(",", 1))
        row = next((r for r in world.accommodations_in(city) if r["NAME"] == name), None)
        for rule in ("parties", "smoking", "children under 10", "visitors", "pets"):
            if row is not None and f"No {rule}" in str(row["house_rules"]):
                constraint = {**query.local_constraint, "house rule": rule}
                return plan, dataclasses.replace(query, local_constraint=constraint), "valid_room_rule"
    return None


MUTATIONS = (invent_restaurant, repeat_restaurant, repeat_attraction, drop_last_day, drive_one_flown_leg,
             cut_the_budget, ask_for_what_the_stay_forbids)


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.__name__)
def test_each_mutation_of_a_gold_plan_fails_the_check_the_public_rules_name(real_world, gold, mutation):
    import copy

    applied = 0
    for query, plan in gold:
        mutated = (mutation(copy.deepcopy(plan), query, real_world) if mutation is ask_for_what_the_stay_forbids
                   else mutation(copy.deepcopy(plan), query))
        if mutated is None:
            continue
        broken_plan, broken_query, check = mutated
        for mode in ("official", "strict"):
            evaluation = evaluate_plan(real_world, broken_query, broken_plan, mode)
            verdict = {**evaluation.commonsense, **evaluation.hard}[check]
            assert verdict.failed and verdict.reason, (mutation.__name__, query.idx, mode, verdict)
            assert not evaluation.final_pass
        applied += 1
    assert applied >= 10, f"{mutation.__name__} applied to only {applied} gold plans"
