"""Intervals for the rates every evaluation reports, and the paired difference of two evaluations on the same items.

A leaf module (the standard library only), so the evaluators (`components/travel/metrics.py`,
`components/toolstar/evaluate.py`) and the comparison scripts share one definition:

    wilson_interval(4, 40)                      # (0.0396, 0.2305): 4 of 40 passed, the 95% Wilson score interval
    paired_difference([1, 0, 1], [0, 0, 1])     # {"n": 3, "mean": 0.333, "se": 0.333}: run - base per item
    bootstrap_interval({"nq": [1, 0, 1], "hotpotqa": [0, 0, 1, 1]})   # the mean of the per-group means, 95%
"""
from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence

Z_95 = 1.959963984540054  # the two-sided 95% normal quantile


def wilson_interval(successes: float, n: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a rate `successes / n` (95% by default): unlike the normal approximation it stays
    inside [0, 1] and is not empty at 0 or n passes, which small evaluation sets hit often. (0, 1) when n is 0."""
    if n < 0 or successes < 0 or successes > n:
        raise ValueError(f"a rate needs 0 <= successes <= n, got {successes} of {n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def rate_interval(rate: float, n: int, z: float = Z_95) -> list[float]:
    """`wilson_interval` of a rate given as a fraction of n items, rounded for a metrics file: [low, high]."""
    low, high = wilson_interval(min(n, max(0.0, rate * n)), n, z)
    return [round(low, 4), round(high, 4)]


def paired_difference(run: Sequence[float], base: Sequence[float]) -> dict[str, float]:
    """Mean and standard error of `run[i] - base[i]` over items scored by both (the same tasks or queries, in the same
    order): the per-item difficulty cancels, so a small effect shows on a small set. `se` is nan below 2 items."""
    if len(run) != len(base):
        raise ValueError(f"a paired difference needs the same items in both: {len(run)} vs {len(base)} values")
    if not run:
        raise ValueError("a paired difference needs at least one item")
    differences = [a - b for a, b in zip(run, base)]
    se = statistics.stdev(differences) / math.sqrt(len(differences)) if len(differences) > 1 else float("nan")
    return {"n": len(differences), "mean": statistics.fmean(differences), "se": se}


def mean_of_means(groups: Mapping[str, Sequence[float]]) -> float:
    """The mean over groups of each group's mean (every group weighs the same); empty groups are left out."""
    means = [statistics.fmean(values) for values in groups.values() if values]
    if not means:
        raise ValueError("a mean of means needs at least one group with values")
    return statistics.fmean(means)


def bootstrap_interval(groups: Mapping[str, Sequence[float]], resamples: int = 2000, seed: int = 0,
                       level: float = 0.95) -> tuple[float, float]:
    """The percentile bootstrap interval of `mean_of_means(groups)`: each resample redraws every group's items with
    replacement, within the group (a stratified bootstrap, so each group keeps its size). Per-item differences of
    two evaluations on the same items give the interval of a paired difference. Seeded: the same input gives the
    same interval."""
    if resamples < 1 or not 0 < level < 1:
        raise ValueError(f"a bootstrap needs resamples >= 1 and 0 < level < 1, got {resamples} and {level}")
    groups = {name: list(values) for name, values in groups.items() if values}
    mean_of_means(groups)  # the same error for no values at all
    rng = random.Random(seed)
    estimates = sorted(
        statistics.fmean(statistics.fmean(rng.choices(values, k=len(values))) for values in groups.values())
        for _ in range(resamples))
    tail = (1 - level) / 2
    return _quantile(estimates, tail), _quantile(estimates, 1 - tail)


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """The q-quantile of sorted values, interpolated linearly between the two nearest ranks."""
    position = q * (len(sorted_values) - 1)
    below = math.floor(position)
    above = min(below + 1, len(sorted_values) - 1)
    return sorted_values[below] + (sorted_values[above] - sorted_values[below]) * (position - below)
