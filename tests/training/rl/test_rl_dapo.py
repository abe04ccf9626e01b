"""DAPO dynamic sampling and overlong shaping."""
import random

import pytest

from components.training.rl.dapo import dynamic_sampling, is_informative, overlong_penalty


def test_overlong_penalty_is_zero_then_a_linear_ramp_then_minus_one():
    # L_max = 100, L_cache = 20: soft zone (80, 100]
    assert overlong_penalty(80, 100, 20) == 0.0
    assert overlong_penalty(90, 100, 20) == pytest.approx(-0.5)
    assert overlong_penalty(100, 100, 20) == pytest.approx(-1.0)
    assert overlong_penalty(101, 100, 20) == -1.0


def test_a_group_is_informative_only_when_its_rewards_differ():
    assert is_informative([0.0, 1.0, 0.0])
    assert not is_informative([0.5, 0.5, 0.5])
    assert not is_informative([1.0])


def test_dynamic_sampling_drops_flat_groups_and_asks_for_exactly_the_missing_ones():
    # the sampler returns groups from a script; "flat" groups have equal rewards
    script = iter([[[1, 1], [0, 1], [0, 0]], [[1, 0], [1, 1]], [[0, 1]]])
    asked = []

    def sample(n):
        asked.append(n)
        return next(script)[:n]

    result = dynamic_sampling(sample, lambda g: g, target_groups=3, max_extra_rounds=5)
    assert asked == [3, 2, 1]
    assert result.groups == [[0, 1], [1, 0], [0, 1]]
    assert (result.rounds, result.sampled_groups, result.dropped_groups, result.filled) == (3, 6, 3, True)


def test_dynamic_sampling_stops_at_the_cap_and_trains_on_what_it_has():
    def sample(n):
        return [[0.5, 0.5]] * (n - 1) + [[0.0, 1.0]]

    result = dynamic_sampling(sample, lambda g: g, target_groups=4, max_extra_rounds=1)
    assert result.rounds == 2
    assert len(result.groups) == 2
    assert not result.filled


def test_dynamic_sampling_drops_failed_episodes_that_differ_only_in_length():
    """DAPO filters on the task reward (its accuracy), not on the total with the overlong penalty: four episodes
    that all fail, one of them past the soft overlong zone, are a tied group and dropped; a group with a delivered
    plan is kept."""
    from types import SimpleNamespace

    from components.training.rl.params import RLParams
    from components.training.rl.rewards import trajectory_reward
    from components.training.rl.samplers import SamplerInputs, collect_rollouts
    from components.travel.source import TravelSource

    params = RLParams.model_validate({"algorithm": "dapo", "num_generations": 4, "queries_per_step": 1,
                                      "dynamic_sampling": {"max_extra_rounds": 0},
                                      "overlong": {"max_tokens": 100, "cache_tokens": 50}})
    failed = [{"plan": None, "termination": "turn_limit", "response_mask": [1] * length}
              for length in (10, 20, 30, 90)]
    source = TravelSource(world=None, reward_settings=params.reward)
    totals = [trajectory_reward(source, r, params, 0.0).total for r in failed]
    assert len(set(totals)) == 2  # the long one carries an overlong penalty: the totals differ
    engine = SimpleNamespace(groups=lambda queries, g: [failed], source=source)
    batch = collect_rollouts(SamplerInputs(engine, ["query"], lambda n: ["query"] * n, params, 0.0, random.Random(0)))
    assert batch.groups == []
    assert batch.extra["dapo/dropped_groups"] == 1 and batch.extra["dapo/kept_groups"] == 0
    assert len(batch.sampled) == 1  # still logged with the step's rewards
