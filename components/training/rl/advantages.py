"""Group-relative advantages (GRPO, Dr.GRPO), broadcast to the tokens the policy sampled.

Symbols as in TRAINING.md: a group is the G trajectories sampled for one query; R_i is trajectory i's scalar
reward; the advantage of every sampled token of trajectory i is

    GRPO:     A_i = (R_i - mean(R_group)) / (std(R_group) + eps)      (scale_rewards="group")
    batch:    A_i = (R_i - mean(R_group)) / (std(R_batch) + eps)      (scale_rewards="batch", TRL's option)
    Dr.GRPO:  A_i =  R_i - mean(R_group)                              (scale_rewards="none")

`std` is the sample standard deviation (Bessel's correction, as `torch.std` and TRL); a group of one has std 0.

Asymmetric weighting (`negative_advantage_weight`, lambda): A_i <- lambda * A_i where A_i < 0; lambda = 1 is the
algorithms as published. A small policy pushed down on its failed episodes spreads probability over every token it
writes (TRAINING.md "RL"; docs/tiny_preset.md session 22): lambda < 1 keeps the push up on the good episodes.

Advantage reweighting (Yang et al., 2025, "Do Not Let Low-Probability Tokens Over-Dominate in RL for LLMs",
arXiv 2505.12929), per sampled token t with pi_old its probability when it was sampled:

    A_t <- [alpha * pi_old(o_t) + (1 - alpha)] * A_t          (alpha = 0: off, the algorithms as published)

The gradient of log pi(o_t) is largest for the least likely tokens, so a few rare sampled tokens of either sign
set the direction of the whole update; alpha > 0 scales their share down.

Rejected turns (`reinforce_rejected_turns: false`): a turn the environment rejected as malformed (a protocol error
it answered with the format reminder; with `rejected_turn_kinds` also a turn cut at the per-turn token limit, which
is never parsed) keeps a negative advantage but never gets a positive one. As published, an episode that recovers from a malformed turn and
delivers a good plan reinforces the malformed turn with the rest.

Turn-level credit for rejected turns (`rejected_turn_advantage`, c < 0): every sampled token of a rejected turn gets
A_t = c in place of its episode's advantage, in delivered and failed episodes alike (a process reward of c for a
malformed turn, credited to that turn only). The outcome advantage of a failed episode spreads its push-down over
every token the episode wrote; holding the turn format is one skill on every query, and this puts its signal on the
tokens that broke it; on a turn cut at the token limit (`rejected_turn_kinds` with `truncated`; a loop, mostly) it
is unlikelihood training against the repetition (Welleck et al., 2019, arXiv 1908.04319), and with `loop` it reaches
only the cut turn's repeating tail (`update.repeating_tail`), not the plan the turn was writing before it looped; with
`name_slip` it reaches the one token where a name the policy coined left every name it had been shown
(`name_slips.NameSlipMarker`). Tokens the policy wrote
with probability near 1 get almost no gradient from log pi, so the push-down lands mostly on the unlikely tokens
where the turn went wrong.
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


def weight_negative(advantages: torch.Tensor, weight: float) -> torch.Tensor:
    """A_i, with every negative A_i multiplied by `weight` (1: unchanged; 0: learn from the better episodes only)."""
    if weight < 0:
        raise ValueError(f"negative_advantage_weight must be >= 0, got {weight}")
    return torch.where(advantages < 0, advantages * weight, advantages)


def token_advantages(advantages: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Broadcast A_i to every token trajectory i sampled: shape (B, T), 0 where response_mask is 0."""
    return advantages[:, None].to(torch.float32) * response_mask.to(torch.float32)


def reweight_by_probability(advantages: torch.Tensor, old_logprobs: torch.Tensor, response_mask: torch.Tensor,
                            alpha: float) -> torch.Tensor:
    """A_t * [alpha * pi_old(o_t) + (1 - alpha)] on sampled tokens, 0 elsewhere (no gradient through pi_old)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"advantage_reweight_alpha must be in [0, 1], got {alpha}")
    keep = response_mask.bool()
    probability = torch.exp(torch.where(keep, old_logprobs.detach().to(torch.float32), torch.zeros_like(advantages)))
    return torch.where(keep, advantages * (alpha * probability + (1.0 - alpha)), torch.zeros_like(advantages))


def rejected_turn_credit(advantages: torch.Tensor, rejected: torch.Tensor, value: float) -> torch.Tensor:
    """A_t, replaced by `value` on every token of a rejected turn (the episode's advantage elsewhere)."""
    return torch.where(rejected.bool(), torch.full_like(advantages, float(value)), advantages)


def never_reinforce(advantages: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """A_t, with 0 where the token belongs to a rejected turn and A_t > 0 (negative advantages stay)."""
    return torch.where(rejected.bool() & (advantages > 0), torch.zeros_like(advantages), advantages)
