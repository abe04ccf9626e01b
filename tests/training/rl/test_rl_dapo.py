"""DAPO dynamic sampling and overlong shaping."""
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
