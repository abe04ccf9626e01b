"""GRPO / Dr.GRPO advantages on hand-made rewards, with the numbers worked out by hand."""
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
    with pytest.raises(ValueError, match="'group', 'batch' or 'none'"):
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
