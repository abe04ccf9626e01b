"""Set metrics with a fixed N: exact numbers on hand-made evaluations."""
from __future__ import annotations

import pytest

from components.travel.evaluate import COMMONSENSE_CHECKS, HARD_CHECKS, CheckResult, PlanEvaluation
from components.travel.metrics import summarize, summarize_modes
from components.travel.tasks import Query

NO_CONSTRAINT = {"house rule": None, "cuisine": None, "room type": None, "transportation": None}


def query(idx: int, level: str = "easy", days: int = 3, **local) -> Query:
    return Query(idx=idx, org="A", dest="B", days=days, visiting_city_number=1,
                 date=tuple(f"2022-03-0{d + 1}" for d in range(days)), people_number=1,
                 local_constraint={**NO_CONSTRAINT, **local}, budget=1000, level=level)


def evaluation(q: Query, cs_failing: tuple[str, ...] = (), hard_failing: tuple[str, ...] = ()) -> PlanEvaluation:
    applicable = {"valid_cost", *({"house rule": "valid_room_rule", "room type": "valid_room_type",
                                   "cuisine": "valid_cuisine", "transportation": "valid_transportation"}[k]
                                  for k in q.set_constraints())}
    commonsense = {c: CheckResult("fail" if c in cs_failing else "pass") for c in COMMONSENSE_CHECKS}
    hard = {h: CheckResult("n/a") if h not in applicable else CheckResult("fail" if h in hard_failing else "pass")
            for h in HARD_CHECKS}
    return PlanEvaluation("strict", True, commonsense, hard)


def test_six_metrics_with_an_undelivered_plan_counted_as_failure():
    queries = [query(0), query(1, "medium", 5, cuisine=["Chinese"]),
               query(2, "hard", 7, **{"house rule": "pets", "transportation": "no flight"}), query(3)]
    evaluations = {
        0: evaluation(queries[0]),                                             # passes everything
        1: evaluation(queries[1], cs_failing=("is_valid_restaurants",)),       # 7/8 commonsense
        2: evaluation(queries[2], hard_failing=("valid_room_rule",)),          # 2 of 3 hard
        # idx 3: no plan delivered
    }
    metrics = summarize(queries, evaluations)
    assert metrics["n"] == 4
    assert metrics["delivery_rate"] == 3 / 4
    assert metrics["commonsense_micro"] == (8 + 7 + 8) / 32
    assert metrics["commonsense_macro"] == 2 / 4
    # hard denominator: N (budget for every query) + set constraints (1 + 2) = 7; passed: 1 + 2 + 2
    assert metrics["hard_micro"] == 5 / 7
    assert metrics["hard_macro"] == 2 / 4
    assert metrics["final_pass"] == 1 / 4
    assert metrics["per_check"]["is_valid_restaurants"] == 2 / 4
    assert metrics["per_check"]["valid_room_rule"] == 0 / 1
    assert metrics["per_check"]["valid_cuisine"] == 1 / 1
    assert metrics["by_level"]["easy"]["final_pass"] == 1 / 2 and metrics["by_level"]["easy"]["n"] == 2
    assert metrics["by_days"]["7"]["hard_micro"] == 2 / 3


def test_aligned_list_form_and_the_file_contract():
    queries = [query(0), query(1)]
    per_query = [{"strict": evaluation(queries[0]), "official": evaluation(queries[0])}, None]
    metrics = summarize_modes(queries, per_query)
    assert metrics["n"] == 2
    assert metrics["strict"]["final_pass"] == metrics["official"]["final_pass"] == 0.5
    with pytest.raises(ValueError, match="2 evaluations for 1 queries"):
        summarize(queries[:1], [None, None])


@pytest.mark.parametrize("answer", ["I could not find a plan, sorry.", "[{'days': 1, 'current_city'", "{}", "[]"])
def test_an_answer_that_is_not_a_plan_is_not_delivered(tiny_world, answer):
    from components.travel.evaluate import evaluate_plan

    for mode in ("official", "strict"):
        result = evaluate_plan(tiny_world, query(0), answer, mode=mode)
        assert not result.delivered and not result.final_pass
        assert all(r.status == "fail" and "no plan delivered" in r.reason for r in result.commonsense.values())
