"""Group-relative advantages (GRPO, Dr.GRPO), broadcast to the tokens the policy sampled.

Symbols: a group is the G trajectories sampled for one query; R_i is trajectory i's scalar
reward; the advantage of every sampled token of trajectory i is

    GRPO:     A_i = (R_i - mean(R_group)) / (std(R_group) + eps)      (scale_rewards="group")
    batch:    A_i = (R_i - mean(R_group)) / (std(R_batch) + eps)      (scale_rewards="batch", TRL's option)
    Dr.GRPO:  A_i =  R_i - mean(R_group)                              (scale_rewards="none")

`std` is the sample standard deviation (Bessel's correction, as `torch.std` and TRL); a group of one has std 0.
A group whose rewards are all equal (within `TIE_TOLERANCE`) carries no signal and gets A_i = 0 exactly: computed
naively, its mean can sit one rounding step away from the rewards, and that residue divided by a std of the same size
plus eps becomes an advantage of one sign (|A| ~ 0.1 for eight SUM rewards of 0.15 in float32). Rewards are taken in
float64 for the same reason.

AEPO (arXiv 2510.14545) then weights each sampled token's advantage by its entropy, `entropy_aware_advantages`.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

ScaleRewards = Literal["group", "batch", "none"]
EPS = 1e-6
TIE_TOLERANCE = 1e-9  # rewards closer than this are equal (DAPO's dynamic sampling drops such groups too)


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


def tied_groups(rewards: torch.Tensor, group_ids: torch.Tensor, tol: float = TIE_TOLERANCE) -> torch.Tensor:
    """True for every trajectory whose group's rewards all lie within `tol` of each other, shape (B,)."""
    index, n_groups = group_index(group_ids)
    highest = torch.full((n_groups,), -math.inf, dtype=rewards.dtype).scatter_reduce(0, index, rewards, "amax")
    lowest = torch.full((n_groups,), math.inf, dtype=rewards.dtype).scatter_reduce(0, index, rewards, "amin")
    return (highest - lowest <= tol)[index]


def batch_std(rewards: torch.Tensor) -> torch.Tensor:
    """Sample std of R over the whole batch (a scalar tensor); 0 for a batch of one."""
    if rewards.numel() < 2:
        return torch.zeros((), dtype=rewards.dtype)
    return rewards.std()


# rl.scale_rewards -> the scale (B,) or scalar that the centred rewards are divided by, from (rewards, group ids)
SCALES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "group": group_std,  # GRPO
    "batch": lambda rewards, group_ids: batch_std(rewards),  # TRL's option
    "none": None,  # Dr.GRPO: no division
}


def group_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, scale_rewards: ScaleRewards = "group", eps: float = EPS
) -> torch.Tensor:
    """A_i per trajectory, shape (B,), in float64: (R_i - group mean), divided by the std that `scale_rewards` names
    (SCALES); exactly 0 in a tied group."""
    if scale_rewards not in SCALES:
        raise ValueError(f"scale_rewards must be one of {', '.join(SCALES)}, got {scale_rewards!r}")
    rewards = rewards.to(torch.float64)
    centred = rewards - group_mean(rewards, group_ids)
    centred = torch.where(tied_groups(rewards, group_ids), torch.zeros_like(centred), centred)
    scale = SCALES[scale_rewards]
    return centred if scale is None else centred / (scale(rewards, group_ids) + eps)


def token_advantages(advantages: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Broadcast A_i to every token trajectory i sampled: shape (B, T), 0 where response_mask is 0."""
    return advantages[:, None].to(torch.float32) * response_mask.to(torch.float32)


def entropy_moments(entropy: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """(mean, std) of the token entropies where mask is 1: the sample std (Bessel's correction), taken as 1 when it
    is 0 or undefined (fewer than two tokens), so that standardising never divides by zero (as the authors' code)."""
    values = entropy.detach()[mask.bool()].double()
    if values.numel() == 0:
        return 0.0, 1.0
    mean = values.mean().item()
    std = values.std().item() if values.numel() > 1 else 0.0
    return mean, (std if std > 0 else 1.0)


def entropy_aware_advantages(
    advantages: torch.Tensor,
    entropy: torch.Tensor,
    mask: torch.Tensor,
    coefficient: float = 0.2,
    moments: tuple[float, float] | None = None,
) -> torch.Tensor:
    """AEPO's entropy-aware advantage estimation (arXiv 2510.14545, "Entropy-Balanced Policy Optimization"):

        A~_t = A_t * (1 + a * A_dH_t),     A_dH_t = (H_t - mean(H)) / std(H)

    per sampled token, with A_t the (B, T) token advantages (the trajectory's group-relative advantage), H_t the
    (B, T) entropy of the distribution that sampled token t (no gradient flows through it) and a = `coefficient`
    (0.2 in the authors' code). mean(H) and std(H) are `moments` (from `entropy_moments` over the tokens they
    should cover: the trainer uses the whole mini-batch) or else those of the sampled tokens given here. A token
    more uncertain than the average gets a larger |A|, a more certain one a smaller; 0 where mask is 0."""
    mean, std = moments if moments is not None else entropy_moments(entropy, mask)
    standardised = (entropy.detach().to(advantages.dtype) - mean) / std
    return advantages * (1.0 + coefficient * standardised) * mask.to(advantages.dtype)


def unweighted(advantages: torch.Tensor, entropy: torch.Tensor | None, mask: torch.Tensor, coefficient: float = 0.0,
               moments: tuple[float, float] | None = None) -> torch.Tensor:
    """Every sampled token of a trajectory keeps its trajectory's advantage (GRPO, DAPO, ARPO)."""
    return advantages


@dataclass(frozen=True)
class TokenWeighting:
    """How a trajectory's advantage varies over its tokens: `apply(advantages, entropy, mask, coefficient,
    moments)`; `needs_entropy` asks the update for the (B, T) entropies and the mini-batch's (mean, std)."""

    apply: Callable[..., torch.Tensor]
    needs_entropy: bool = False


# rl.token_weighting -> the token weighting of the advantages
TOKEN_WEIGHTINGS: dict[str, TokenWeighting] = {
    "none": TokenWeighting(unweighted),
    "entropy_aware": TokenWeighting(entropy_aware_advantages, needs_entropy=True),  # AEPO
}
