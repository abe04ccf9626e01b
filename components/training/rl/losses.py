"""The policy-gradient objective: clipped importance ratios, KL to a reference, entropy, loss aggregation.

All inputs are (B, T) tensors over the same token positions; `mask` is the response mask (1 exactly on tokens the
policy sampled). Per token t of trajectory i (PPO's clipped objective as GRPO and DAPO use it):

    r_t      = exp(log pi(o_t) - log pi_old(o_t))
    L_t      = -min(r_t * A_t, clip(r_t, 1 - epsilon, 1 + epsilon_high) * A_t)
    KL_t     = exp(ref_t - logp_t) - (ref_t - logp_t) - 1          (Schulman's k3 estimator, >= 0)
    H_t      = -sum_v pi(v) log pi(v)                                (entropy of the whole next-token distribution)
    loss_t   = L_t + beta * KL_t - entropy_coeff * H_t               (verl's sign: > 0 a bonus, < 0 sharpens)

and the mini-batch loss aggregates loss_t over masked tokens (see `aggregate_loss`). AEPO replaces L_t by
`entropy_balanced_surrogate_loss`, whose upper clip bound keeps a gradient. Masked positions are forced to
r = 1 and KL = 0 before anything else so that a garbage log-probability there (padding, a tool response, -inf)
can never leak into the ratios or the gradient.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

LossType = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def masked_log_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log r_t = logp_t - old_t on sampled tokens, exactly 0 elsewhere (no NaN/inf from masked positions)."""
    keep = mask.bool()
    zeros = torch.zeros_like(logprobs)
    return torch.where(keep, logprobs, zeros) - torch.where(keep, old_logprobs.to(logprobs.dtype), zeros)


def probability_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """r_t = pi(o_t) / pi_old(o_t) on sampled tokens; 1 on masked positions."""
    return torch.exp(masked_log_ratio(logprobs, old_logprobs, mask))


def clipped_surrogate_loss(
    ratio: torch.Tensor, advantages: torch.Tensor, epsilon: float = 0.2, epsilon_high: float | None = None
) -> torch.Tensor:
    """L_t = -min(r_t A_t, clip(r_t, 1 - epsilon, 1 + epsilon_high) A_t) per token (epsilon_high defaults to epsilon;
    DAPO's clip-higher uses 0.28)."""
    high = epsilon if epsilon_high is None else epsilon_high
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - epsilon, 1.0 + high) * advantages
    return -torch.minimum(unclipped, clipped)


def entropy_balanced_surrogate_loss(
    ratio: torch.Tensor, advantages: torch.Tensor, epsilon: float = 0.2, epsilon_high: float | None = None
) -> torch.Tensor:
    """AEPO's entropy clipping-balanced objective (arXiv 2510.14545, "Entropy-Balanced Policy Optimization"):

        L_t = -min(r_t A_t, clip(r_t, 1 - epsilon, (1 + epsilon_high) / sg(r_t) * r_t) A_t)

    with sg the stop-gradient. The value is exactly `clipped_surrogate_loss`'s; only the gradient differs: a token
    past the upper bound with A_t > 0 (mostly high-entropy ones, whose ratios move most) keeps the gradient
    -(1 + epsilon_high) A_t grad log pi(o_t) instead of none. The lower bound (r_t < 1 - epsilon, A_t < 0) still
    stops the gradient, and A_t < 0 with r_t above the upper bound takes the unclipped term, as in PPO."""
    high = epsilon if epsilon_high is None else epsilon_high
    upper = (1.0 + high) * ratio / ratio.detach()  # = 1 + epsilon_high in value, d/dlog pi = 1 + epsilon_high
    clipped_ratio = torch.where(ratio > 1.0 + high, upper, torch.clamp(ratio, min=1.0 - epsilon))
    return -torch.minimum(ratio * advantages, clipped_ratio * advantages)


def clip_fraction(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
) -> dict[str, float]:
    """Share of sampled tokens whose gradient the clip removed: low (r < 1-eps, A < 0), high (r > 1+eps_high, A > 0),
    and their sum `clip_fraction` (TRL's clip_ratio/low_mean, high_mean, region_mean)."""
    high = epsilon if epsilon_high is None else epsilon_high
    keep = mask.bool()
    n = keep.sum().clamp(min=1).item()
    low_clipped = (ratio < 1.0 - epsilon) & (advantages < 0) & keep
    high_clipped = (ratio > 1.0 + high) & (advantages > 0) & keep
    low, hi = low_clipped.sum().item() / n, high_clipped.sum().item() / n
    return {"clip_fraction_low": low, "clip_fraction_high": hi, "clip_fraction": low + hi}


KL_LOG_RATIO_CLAMP = 20.0  # |ref_t - logp_t| is clamped here before the exp (verl's low_var_kl)
KL_CLAMP = 10.0  # and KL_t at this value: one token the policy has made far likelier than the reference cannot
# turn the KL term into inf or swamp the step's gradient (exp(30) ~ 1e13)


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """KL_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1 on sampled tokens, 0 elsewhere (the k3 estimator of
    KL(pi || ref)), with the log-ratio clamped to +-KL_LOG_RATIO_CLAMP and KL_t to at most KL_CLAMP, as verl does."""
    delta = masked_log_ratio(ref_logprobs, logprobs, mask).clamp(-KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)
    return (torch.exp(delta) - delta - 1.0).clamp(max=KL_CLAMP)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """H_t = -sum_v p_v log p_v of the next-token distribution at each position, from logits (..., V)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` over positions where mask is 1 (0 when the mask is empty)."""
    m = mask.to(values.dtype)
    return (values * m).sum() / m.sum().clamp(min=1)


def token_mean(per_token: torch.Tensor, mask: torch.Tensor, tokens: float, sequences: int,
               max_completion_length: int) -> torch.Tensor:
    """sum_i sum_t loss_it / (tokens in the whole mini-batch)  (DAPO; TRL "dapo")"""
    return per_token.sum() / max(float(tokens), 1.0)


def seq_mean_token_mean(per_token: torch.Tensor, mask: torch.Tensor, tokens: float, sequences: int,
                        max_completion_length: int) -> torch.Tensor:
    """sum_i [sum_t loss_it / |o_i|] / (sequences in the mini-batch)  (the GRPO paper; TRL "grpo")"""
    per_seq = per_token.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)
    return per_seq.sum() / max(sequences, 1)


def seq_mean_token_sum_norm(per_token: torch.Tensor, mask: torch.Tensor, tokens: float, sequences: int,
                            max_completion_length: int) -> torch.Tensor:
    """sum_i sum_t loss_it / (sequences in the mini-batch * L_max)  (Dr.GRPO; TRL "dr_grpo")"""
    return per_token.sum() / (max(sequences, 1) * max_completion_length)


Aggregation = Callable[[torch.Tensor, torch.Tensor, float, int, int], torch.Tensor]
# rl.loss_type -> how the masked per-token losses of a micro-batch become its share of the mini-batch loss
AGGREGATIONS: dict[str, Aggregation] = {"token-mean": token_mean, "seq-mean-token-mean": seq_mean_token_mean,
                                        "seq-mean-token-sum-norm": seq_mean_token_sum_norm}
Surrogate = Callable[[torch.Tensor, torch.Tensor, float, "float | None"], torch.Tensor]
# rl.surrogate -> the per-token policy loss L_t from the ratios and advantages
SURROGATES: dict[str, Surrogate] = {"clipped": clipped_surrogate_loss,
                                    "entropy_balanced": entropy_balanced_surrogate_loss}


def aggregate_loss(
    token_loss: torch.Tensor,
    mask: torch.Tensor,
    loss_type: LossType,
    minibatch_tokens: int | float,
    minibatch_sequences: int,
    max_completion_length: int,
) -> torch.Tensor:
    """This micro-batch's share of the mini-batch loss by the aggregation `loss_type` names (AGGREGATIONS); summing
    the shares over gradient-accumulation micro-batches gives exactly the loss of the whole mini-batch, so the caller
    never divides by the number of micro-batches."""
    if loss_type not in AGGREGATIONS:
        raise ValueError(f"loss_type must be one of {', '.join(AGGREGATIONS)}, got {loss_type!r}")
    m = mask.to(token_loss.dtype)
    return AGGREGATIONS[loss_type](token_loss * m, m, minibatch_tokens, minibatch_sequences, max_completion_length)


@dataclass(frozen=True)
class LossSpec:
    """The objective's settings: the clip range, the KL and entropy coefficients, and the named surrogate
    (SURROGATES) and aggregation (AGGREGATIONS)."""

    epsilon: float = 0.2
    epsilon_high: float | None = None
    beta: float = 0.0
    entropy_coeff: float = 0.0
    surrogate: str = "clipped"
    loss_type: LossType = "token-mean"
    max_completion_length: int = 1


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    spec: LossSpec = LossSpec(),
    *,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    importance_weights: torch.Tensor | None = None,
    minibatch: tuple[float, int] | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """loss_t = L_t + beta KL_t - entropy_coeff H_t aggregated over the micro-batch; returns (loss, stats) with the
    mean ratio, the clip fractions and the mean KL over sampled tokens. `advantages` is per token (B, T); `entropy`
    (B, T, with its gradient) is needed only when entropy_coeff is not 0. `spec.surrogate` names L_t (AEPO's
    `entropy_balanced`: the clip fractions then count tokens past a bound as before, though those past the upper
    one keep a gradient). `importance_weights` (B, T, no gradient) multiply L_t: truncated importance sampling of
    the sampler/trainer mismatch. `minibatch` is the (tokens, sequences) of the whole mini-batch this micro-batch is
    a share of (None: this micro-batch alone)."""
    if spec.beta and ref_logprobs is None:
        raise ValueError("beta > 0 needs ref_logprobs (the reference model's log-probabilities)")
    if spec.entropy_coeff and entropy is None:
        raise ValueError("entropy_coeff != 0 needs the per-token entropy (B, T) with its gradient")
    if spec.surrogate not in SURROGATES:
        raise ValueError(f"surrogate must be one of {', '.join(SURROGATES)}, got {spec.surrogate!r}")
    ratio = probability_ratio(logprobs, old_logprobs, mask)
    token_loss = SURROGATES[spec.surrogate](ratio, advantages, spec.epsilon, spec.epsilon_high)
    if importance_weights is not None:
        token_loss = token_loss * importance_weights.detach()
    kl = k3_kl(logprobs, ref_logprobs, mask) if ref_logprobs is not None else torch.zeros_like(token_loss)
    if spec.beta:
        token_loss = token_loss + spec.beta * kl
    if spec.entropy_coeff:
        token_loss = token_loss - spec.entropy_coeff * torch.where(mask.bool(), entropy, torch.zeros_like(entropy))
    tokens, sequences = minibatch if minibatch is not None else (mask.sum().item(), mask.shape[0])
    loss = aggregate_loss(token_loss, mask, spec.loss_type, tokens, sequences, spec.max_completion_length)
    with torch.no_grad():
        stats = clip_fraction(ratio.detach(), advantages, mask, spec.epsilon, spec.epsilon_high)
        stats["ratio_mean"] = masked_mean(ratio.detach(), mask).item()
        stats["kl"] = masked_mean(kl.detach(), mask).item()
    return loss, stats


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log pi(target_t) from next-token logits (B, T, V) and targets (B, T), without materialising log_softmax."""
    logits = logits.float()
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)
