"""Group-relative advantages (GRPO, Dr.GRPO), broadcast to the tokens the policy sampled.

Symbols: a group is the G trajectories sampled for one query; R_i is trajectory i's scalar
reward; the advantage of every sampled token of trajectory i is

    GRPO:     A_i = (R_i - mean(R_group)) / (std(R_group) + eps)      (scale_rewards="group")
    batch:    A_i = (R_i - mean(R_group)) / (std(R_batch) + eps)      (scale_rewards="batch", TRL's option)
    Dr.GRPO:  A_i =  R_i - mean(R_group)                              (scale_rewards="none")

`std` is the sample standard deviation (Bessel's correction, as `torch.std` and TRL); a group of one has std 0.
"""
from __future__ import annotations

from typing import Literal

import torch

ScaleRewards = Literal["group", "batch", "none"]
EPS = 1e-6


def group_index(group_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Map arbitrary group ids to 0..n_groups-1; return (index per trajectory, number of groups)."""
    uniques, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, int(uniques.numel())


def group_mean(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """mean(R_group) for every trajectory, shape (B,)."""
    index, n_groups = group_index(group_ids)
    sums = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, index, rewards)
    counts = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, index, torch.ones_like(rewards))
    return (sums / counts)[index]


def group_std(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Sample std of R within each trajectory's group, shape (B,); 0 for a group of one."""
    index, n_groups = group_index(group_ids)
    centred_sq = (rewards - group_mean(rewards, group_ids)) ** 2
    sq_sums = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, index, centred_sq)
    counts = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, index, torch.ones_like(rewards))
    variance = sq_sums / (counts - 1).clamp(min=1)
    return variance.sqrt()[index]


def batch_std(rewards: torch.Tensor) -> torch.Tensor:
    """Sample std of R over the whole batch (a scalar tensor); 0 for a batch of one."""
    if rewards.numel() < 2:
        return torch.zeros((), dtype=rewards.dtype)
    return rewards.std()


def group_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, scale_rewards: ScaleRewards = "group", eps: float = EPS
) -> torch.Tensor:
    """A_i per trajectory, shape (B,): (R_i - group mean), divided by the std that `scale_rewards` names."""
    rewards = rewards.to(torch.float64) if rewards.dtype == torch.float64 else rewards.float()
    centred = rewards - group_mean(rewards, group_ids)
    if scale_rewards == "group":
        return centred / (group_std(rewards, group_ids) + eps)
    if scale_rewards == "batch":
        return centred / (batch_std(rewards) + eps)
    if scale_rewards == "none":
        return centred
    raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', got {scale_rewards!r}")


def token_advantages(advantages: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Broadcast A_i to every token trajectory i sampled: shape (B, T), 0 where response_mask is 0."""
    return advantages[:, None].to(torch.float32) * response_mask.to(torch.float32)
