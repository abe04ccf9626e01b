"""DAPO's sampling-side pieces: dynamic sampling and overlong reward shaping (Yu et al., 2025).

Dynamic sampling: a group whose task rewards are all equal (DAPO filters on accuracy, before any length shaping) is
dropped and more queries are sampled until the batch holds `target_groups` informative groups, with a cap
on the extra rounds (after which the step trains on what it has).

Overlong shaping (soft overlong punishment), with L the response length, L_max the limit, L_cache the soft zone:

    R_overlong(L) = 0                              if L <= L_max - L_cache
                  = ((L_max - L_cache) - L) / L_cache   if L_max - L_cache < L <= L_max
                  = -1                             if L > L_max
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from components.training.rl.advantages import TIE_TOLERANCE

G = TypeVar("G")


def is_informative(rewards: Sequence[float], tol: float = TIE_TOLERANCE) -> bool:
    """True when a group's rewards are not all equal (`group_advantages` gives it a non-zero advantage somewhere)."""
    return len(rewards) > 1 and (max(rewards) - min(rewards)) > tol


def overlong_penalty(length: int, max_length: int, cache_length: int) -> float:
    """R_overlong(L): 0 inside the budget, a linear ramp to -1 over the last `cache_length` tokens, -1 beyond."""
    if length > max_length:
        return -1.0
    soft_start = max_length - cache_length
    if length <= soft_start or cache_length <= 0:
        return 0.0
    return (soft_start - length) / cache_length


@dataclass
class DynamicSample(Generic[G]):
    """What dynamic sampling kept, and what it cost."""

    groups: list[G] = field(default_factory=list)
    rounds: int = 0
    sampled_groups: int = 0
    dropped_groups: int = 0
    filled: bool = False


def dynamic_sampling(
    sample_groups: Callable[[int], list[G]],
    group_rewards: Callable[[G], Sequence[float]],
    target_groups: int,
    max_extra_rounds: int,
    total: Callable[[int], int] = lambda count: count,
) -> DynamicSample[G]:
    """Call `sample_groups(n)` for n groups at a time, keep the informative ones, until `target_groups` are kept or
    `1 + max_extra_rounds` rounds have run. Each extra round asks for exactly the number of groups still missing.

    Data parallel, `sample_groups(n)` returns this rank's share of n groups and `total(count)` sums a count over the
    ranks, so every rank runs the same rounds and the target counts the groups kept by all of them together."""
    result: DynamicSample[G] = DynamicSample()
    kept = 0
    while result.rounds <= max_extra_rounds and kept < target_groups:
        batch = sample_groups(target_groups - kept)
        result.rounds += 1
        result.sampled_groups += len(batch)
        for group in batch:
            if is_informative(group_rewards(group)):
                result.groups.append(group)
            else:
                result.dropped_groups += 1
        kept = total(len(result.groups))
        if total(len(batch)) == 0:
            break
    result.filled = kept >= target_groups
    return result
