"""GRPO / Dr.GRPO advantages on hand-made rewards, with the numbers worked out by hand."""
import itertools
import math

import pytest
import torch

from components.training.rl.advantages import (
    entropy_aware_advantages,
    entropy_moments,
    group_advantages,
    group_mean,
    group_std,
    token_advantages,
)


def test_grpo_advantage_is_reward_minus_group_mean_over_group_std():
    # group 0: rewards 1, 0, 0, 1 -> mean 0.5, sample std sqrt(1/3); group 1: 0.2, 0.4 -> mean 0.3, std sqrt(0.02)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.2, 0.4])
    groups = torch.tensor([0, 0, 0, 0, 7, 7])
    adv = group_advantages(rewards, groups, "group")
    s0 = math.sqrt(1 / 3)
    s1 = math.sqrt(0.02)
    expected = [0.5 / (s0 + 1e-6), -0.5 / (s0 + 1e-6), -0.5 / (s0 + 1e-6), 0.5 / (s0 + 1e-6),
                -0.1 / (s1 + 1e-6), 0.1 / (s1 + 1e-6)]
    assert adv.tolist() == pytest.approx(expected, rel=1e-5)


def test_dr_grpo_advantage_is_not_divided_by_the_std():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.2, 0.4])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    assert group_advantages(rewards, groups, "none").tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, -0.1, 0.1])


def test_batch_scaling_divides_by_the_std_of_the_whole_batch():
    rewards = torch.tensor([1.0, 0.0, 3.0, 5.0])
    groups = torch.tensor([0, 0, 1, 1])
    batch_std = torch.tensor([1.0, 0.0, 3.0, 5.0]).std().item()  # sqrt(14.75/3)
    assert batch_std == pytest.approx(math.sqrt(14.75 / 3))
    expected = [0.5 / (batch_std + 1e-6), -0.5 / (batch_std + 1e-6), -1 / (batch_std + 1e-6), 1 / (batch_std + 1e-6)]
    assert group_advantages(rewards, groups, "batch").tolist() == pytest.approx(expected, rel=1e-5)


def test_a_group_with_equal_rewards_or_a_single_member_has_zero_advantage():
    rewards = torch.tensor([0.7, 0.7, 0.7, 0.3])
    groups = torch.tensor([0, 0, 0, 1])
    assert group_std(rewards, groups).tolist() == pytest.approx([0, 0, 0, 0], abs=1e-7)
    assert group_advantages(rewards, groups, "group").tolist() == pytest.approx([0, 0, 0, 0], abs=1e-5)
    assert group_mean(rewards, groups).tolist() == pytest.approx([0.7, 0.7, 0.7, 0.3])


def test_the_advantage_is_broadcast_only_to_sampled_tokens():
    adv = torch.tensor([2.0, -1.0])
    mask = torch.tensor([[0, 1, 1, 0], [1, 0, 1, 1]])
    assert token_advantages(adv, mask).tolist() == [[0, 2, 2, 0], [-1, 0, -1, -1]]


def test_an_unknown_scaling_names_the_valid_ones():
    with pytest.raises(ValueError, match="scale_rewards must be one of group, batch, none"):
        group_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), "std")


def test_aepos_entropy_aware_advantage_scales_each_token_by_its_standardised_entropy():
    # sampled tokens' entropies 1, 2, 3 (the 4th position is masked): mean 2, sample std 1 -> standardised -1, 0, 1
    adv = torch.tensor([[2.0, 2.0], [-1.0, 5.0]])
    entropy = torch.tensor([[1.0, 2.0], [3.0, 99.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    assert entropy_moments(entropy, mask) == pytest.approx((2.0, 1.0))
    # A * (1 + 0.5 * z): 2 * 0.5, 2 * 1, -1 * 1.5, masked 0
    assert entropy_aware_advantages(adv, entropy, mask, coefficient=0.5).tolist() == [[1.0, 2.0], [-1.5, 0.0]]
    # the mini-batch's moments when given: z = (H - 1) / 2 -> 0, 0.5, 1
    assert entropy_aware_advantages(adv, entropy, mask, 0.5, moments=(1.0, 2.0)).tolist() == [[2.0, 2.5], [-1.5, 0.0]]


def test_equal_entropies_leave_the_advantages_alone():
    adv = torch.tensor([[1.0, -2.0]])
    entropy = torch.tensor([[0.7, 0.7]])
    mask = torch.ones(1, 2)
    assert entropy_moments(entropy, mask) == (pytest.approx(0.7), 1.0)  # std 0 -> 1: no division by zero
    assert entropy_aware_advantages(adv, entropy, mask, 0.2)[0].tolist() == pytest.approx([1.0, -2.0])
    assert entropy_moments(torch.tensor([[4.0]]), torch.ones(1, 1)) == (4.0, 1.0)  # one token: no std either


def sum_reward_values() -> set[float]:
    """Every SUM reward a delivered plan can earn (equal weights): cs_micro k/8, hard_micro j/n over the n
    applicable hard checks (valid_cost always applies), and the three 0/1 components, through the reward function."""
    from components.travel.reward import RewardWeights, _weighted_mean, COMPONENTS

    values = set()
    for k in range(9):
        for n in range(1, 6):
            for j in range(n + 1):
                for cs_macro, hard_macro, success in itertools.product((0.0, 1.0), repeat=3):
                    comps = {"cs_micro": k / 8, "hard_micro": j / n, "cs_macro": cs_macro, "hard_macro": hard_macro,
                             "success": success}
                    values.add(_weighted_mean(comps, RewardWeights(), COMPONENTS))
    return values


def macro_reward_values() -> set[float]:
    return {(a + b + c) / 3 for a, b, c in itertools.product((0.0, 1.0), repeat=3)}


def toolstar_reward_values() -> set[float]:
    """Tool-Star's: -1 (format), 0, a token F1 2c / (p + g) of answers up to 12 tokens, and F1 + the multi-tool
    bonus."""
    from components.toolstar.reward import MULTI_TOOL_BONUS

    f1s = {2 * c / (p + g) for p in range(1, 13) for g in range(1, 13) for c in range(1, min(p, g) + 1)}
    return {-1.0, 0.0, *f1s, *(f1 + MULTI_TOOL_BONUS for f1 in f1s)}


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_a_tied_group_has_an_advantage_of_exactly_zero_for_every_reward_value_and_group_size(scale_rewards):
    """Eight SUM rewards of 0.15 once got |A| ~ 0.1, all of one sign (the float32 mean one rounding step off,
    divided by a std of the same size): every value SUM, MACRO and Tool-Star can produce, tied in groups of 2 to 16,
    next to an informative group (so batch scaling has a std), gives exactly 0."""
    values = sorted(sum_reward_values() | macro_reward_values() | toolstar_reward_values() | {-1.0, -0.5})
    assert len(values) > 300
    for size in range(2, 17):
        for value in values:
            rewards = torch.tensor([value] * size + [0.0, 1.0], dtype=torch.float32)
            groups = torch.tensor([0] * size + [1, 1])
            adv = group_advantages(rewards, groups, scale_rewards)
            assert adv[:size].abs().max().item() == 0.0, (value, size)
            assert adv[size:].abs().min().item() > 0.4  # the informative group keeps its signal


def test_rewards_that_differ_only_by_float_noise_are_a_tie():
    rewards = torch.tensor([0.15, 0.15 + 1e-12, 0.15], dtype=torch.float64)
    assert group_advantages(rewards, torch.tensor([0, 0, 0]), "group").tolist() == [0.0, 0.0, 0.0]
