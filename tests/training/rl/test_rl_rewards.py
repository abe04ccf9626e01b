"""From a rollout record to its reward: strict evaluation -> STAR reward kind (the travel task source) -> overlong
shaping (the trainer's)."""
import pytest

from components.training.rl.params import RLParams
from components.training.rl.rewards import trajectory_reward as shaped_reward
from components.travel.source import TravelSource, check_pass_rates, strict_evaluation


def trajectory_reward(record: dict, params: RLParams, progress: float):
    """The reward RL trains on for a travel rollout under `params`."""
    source = TravelSource(world=None, reward_settings=params.reward)
    return shaped_reward(source, record, params, progress)


def record_with(evaluation: dict, termination="answer", sampled=10) -> dict:
    return {"evaluation": evaluation, "termination": termination, "response_mask": [1] * sampled + [0] * 5}


def fake_strict(cs_pass: int, hard: dict[str, str], delivered=True) -> dict:
    names = ["is_valid_information_in_current_city", "is_valid_information_in_sandbox", "is_reasonable_visiting_city",
             "is_valid_restaurants", "is_valid_attractions", "is_valid_transportation", "is_valid_accommodation",
             "is_not_absent"]
    return {"strict": {"mode": "strict", "delivered": delivered, "final_pass": False, "total_cost": 1.0,
                       "plan_error": None,
                       # the first checks fail, is_not_absent (the gate of commonsense credit) last
                       "commonsense": {n: {"status": "pass" if i >= len(names) - cs_pass else "fail", "reason": ""}
                                       for i, n in enumerate(names)},
                       "hard": {n: {"status": s, "reason": ""} for n, s in hard.items()}}}


def test_sum_is_the_mean_of_the_five_components():
    ev = fake_strict(6, {"valid_cost": "pass", "valid_room_type": "fail", "valid_cuisine": "n/a"})
    r = trajectory_reward(record_with(ev), RLParams.model_validate({"reward": {"kind": "sum"}}), progress=0.0)
    # cs_micro 6/8, hard_micro 1/2, cs_macro 0, hard_macro 0, success 0
    assert r.components == {"cs_micro": 0.75, "hard_micro": 0.5, "cs_macro": 0.0, "hard_macro": 0.0, "success": 0.0}
    assert r.total == pytest.approx((0.75 + 0.5) / 5)
    assert r.kind == "sum" and not r.format_applied


def test_curriculum_moves_from_sum_to_macro_to_success_with_progress():
    ev = fake_strict(8, {"valid_cost": "pass"})  # passes everything: cs_macro = hard_macro = success = 1
    params = RLParams.model_validate({"reward": {"kind": "curriculum", "curriculum_boundaries": [0.5, 0.8]}})
    assert [trajectory_reward(record_with(ev), params, p).kind for p in (0.1, 0.6, 0.9)] == ["sum", "macro", "success"]


def test_a_protocol_failure_gets_the_format_reward():
    ev = fake_strict(8, {"valid_cost": "pass"})
    params = RLParams.model_validate({"reward": {"kind": "sum", "format_reward": -0.5}})
    r = trajectory_reward(record_with(ev, termination="protocol_errors"), params, 0.0)
    assert r.total == -0.5 and r.format_applied


def test_overlong_shaping_is_added_on_the_sampled_length():
    ev = fake_strict(8, {"valid_cost": "pass"})
    params = RLParams.model_validate({"algorithm": "dapo", "reward": {"kind": "success"},
                                      "overlong": {"max_tokens": 20, "cache_tokens": 10}})
    r = trajectory_reward(record_with(ev, sampled=15), params, 0.0)  # 5 tokens into the 10-token soft zone
    assert r.task == 1.0 and r.overlong == pytest.approx(-0.5) and r.total == pytest.approx(0.5)


def test_strict_evaluation_of_a_missing_plan_fails_every_applicable_check(tiny_world, rl_queries_path):
    from components.travel.tasks import load_queries

    query = load_queries(rl_queries_path)[0]
    evaluation = strict_evaluation(tiny_world, query, {"plan": None})
    rates = check_pass_rates([{"evaluation": evaluation}])
    assert rates["is_not_absent"] == 0.0 and rates["valid_cost"] == 0.0
    assert "valid_cuisine" not in rates  # n/a for a query without a cuisine constraint


def test_rl_reward_is_the_environments_own_typed_params():
    """`rl.reward` is parsed by the environment of `env.kind` (its `REWARD_PARAMS`): one model, one set of defaults,
    handed to the task source as it is."""
    from components.params import ParamsError, parse_section
    from components.toolstar.source import RewardParams as ToolStarReward
    from components.travel.reward import RewardParams as TravelReward

    travel = RLParams.model_validate({"reward": {"kind": "macro", "weights": {"success": 2.0}}})
    assert isinstance(travel.reward, TravelReward) and travel.reward.reward_weights().success == 2.0
    assert travel.model_dump(mode="json")["reward"]["kind"] == "macro"  # the fingerprint hashes every field
    assert isinstance(RLParams(env={"kind": "toolstar"}).reward, ToolStarReward)
    with pytest.raises(ParamsError, match=r"reward.weights: .*unknown components \['bogus'\]"):
        parse_section({"rl": {"reward": {"weights": {"bogus": 1.0}}}}, "rl", RLParams)
    with pytest.raises(ParamsError, match="reward.format_reward: Extra inputs .* env.kind toolstar"):
        parse_section({"rl": {"env": {"kind": "toolstar"}, "reward": {"format_reward": -1.0}}}, "rl", RLParams)
