"""Rewards from an evaluation: exact values of SUM, MACRO, SUCCESS, CURRICULUM and the format reward."""
from __future__ import annotations

import pytest

from components.travel.evaluate import COMMONSENSE_CHECKS, CheckResult, PlanEvaluation
from components.travel.reward import RewardWeights, curriculum_stage, reward


def evaluation(cs_failing: int = 0, hard: dict | None = None, delivered: bool = True) -> PlanEvaluation:
    commonsense = {c: CheckResult("fail" if i < cs_failing else "pass") for i, c in enumerate(COMMONSENSE_CHECKS)}
    hard = hard or {"valid_cost": "pass", "valid_room_rule": "n/a", "valid_room_type": "n/a",
                    "valid_cuisine": "n/a", "valid_transportation": "n/a"}
    return PlanEvaluation("strict", delivered, commonsense, {k: CheckResult(v) for k, v in hard.items()})


PARTIAL = evaluation(cs_failing=2, hard={"valid_cost": "pass", "valid_room_rule": "fail", "valid_room_type": "pass",
                                         "valid_cuisine": "n/a", "valid_transportation": "pass"})


def test_components_of_a_partial_plan():
    r = reward(PARTIAL, "sum")
    assert (r.cs_micro, r.hard_micro, r.cs_macro, r.hard_macro, r.success) == (6 / 8, 3 / 4, 0.0, 0.0, 0.0)
    assert r.reward == pytest.approx((0.75 + 0.75) / 5)
    assert not r.format_applied


def test_each_kind_on_a_perfect_plan_and_on_a_partial_one():
    perfect = evaluation()
    for kind in ("sum", "macro", "success", "curriculum"):
        assert reward(perfect, kind).reward == 1.0
    assert reward(PARTIAL, "macro").reward == 0.0
    assert reward(PARTIAL, "success").reward == 0.0
    commonsense_only = evaluation(hard={"valid_cost": "fail", "valid_room_rule": "n/a", "valid_room_type": "n/a",
                                        "valid_cuisine": "n/a", "valid_transportation": "n/a"})
    assert reward(commonsense_only, "macro").reward == pytest.approx(1 / 3)
    assert reward(commonsense_only, "sum").reward == pytest.approx((1 + 0 + 1 + 0 + 0) / 5)


def test_weights_reweight_the_sum():
    weights = RewardWeights(cs_micro=2.0, hard_micro=0.0, cs_macro=0.0, hard_macro=0.0, success=2.0)
    assert reward(PARTIAL, "sum", weights=weights).reward == pytest.approx(0.75 / 2)


def test_curriculum_moves_from_sum_to_macro_to_success():
    assert [curriculum_stage(p) for p in (0.0, 0.34, 0.9)] == ["sum", "macro", "success"]
    assert reward(PARTIAL, "curriculum", progress=0.1).reward == pytest.approx(0.3)
    assert reward(PARTIAL, "curriculum", progress=0.5).kind == "macro"
    assert reward(PARTIAL, "curriculum", progress=0.5, curriculum_boundaries=(0.6, 0.8)).kind == "sum"
    with pytest.raises(ValueError, match="boundaries"):
        curriculum_stage(0.5, (0.8, 0.2))


def test_format_reward_for_no_plan_or_a_protocol_failure():
    assert reward(None, "sum", format_reward=-1.0).reward == -1.0
    undelivered = reward(evaluation(delivered=False), "success", format_reward=-0.5)
    assert undelivered.format_applied and undelivered.reward == -0.5
    assert reward(evaluation(), "sum", protocol_failure=True).reward == 0.0
    with pytest.raises(ValueError, match="reward kind"):
        reward(PARTIAL, "dense")
