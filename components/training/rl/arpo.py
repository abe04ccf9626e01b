"""ARPO: entropy-guided branching of multi-turn rollouts (Dong et al., 2025, arXiv 2507.19849).

Per query, with a budget of M samples of which N start as full rollouts:
1. start N episodes; the entropy of the first k tokens of an episode's first turn is its initial entropy H_init
   (kept per trajectory and per batch: it is never carried over from an earlier batch);
2. each round every active episode generates one turn; for a turn generated right after a tool response, with H_t
   the entropy of its first k tokens, the episode branches with probability

       p_t = clip(alpha + beta * dH_t, 0, 1),     dH_t = H_t - H_init

   (at most one branch per source per round, while the query's budget M allows). A branch is a copy of the
   partial trajectory as it stood right after the tool response (prefix, masks, counters), which then samples its
   own continuation of the uncertain segment;
3. when every episode has finished, the rest of the budget is filled with fresh full rollouts.
All M samples of a query form one group: plain GRPO over them is ARPO's default ("soft") advantage.

The tree itself (`branching_rollouts`) is shared with AEPO (`aepo.py`), which parameterises it: how many full
rollouts each query starts with (ARPO: N for every query; AEPO: its entropy pre-monitoring's split of M) and the rule
that turns a branch point into a probability (a `BranchRule` of the turn's entropy, the trajectory's H_init and the
number of consecutive branch points at which the trajectory branched just before; ARPO's rule ignores that count).
"""
from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class TurnInfo:
    """What the engine reports about the turn an episode just generated."""

    after_tool: bool  # the turn was generated right after a tool response (a possible branch point)
    entropy: float  # entropy of the first k tokens of the turn
    done: bool  # the episode has finished


class BranchingEngine(Protocol):
    """The rollout engine as ARPO drives it (RolloutEngine implements it; tests script it)."""

    def start(self, query: Any, n: int) -> list[Any]:
        """n fresh episodes of `query`."""

    def advance(self, episodes: list[Any]) -> list[TurnInfo]:
        """Generate one turn for each episode (one batched call) and step its environment."""

    def branch(self, episode: Any) -> Any:
        """A copy of `episode` as it stood just before its last turn (right after the tool response)."""


def segment_entropy(token_entropies: Sequence[float], k: int) -> float:
    """Mean entropy of the first k tokens of a turn (all of them when the turn is shorter; 0 when empty)."""
    head = list(token_entropies[:k])
    return sum(head) / len(head) if head else 0.0


def branch_probability(entropy: float, initial_entropy: float, alpha: float = 0.5, beta: float = 0.2) -> float:
    """p_t = clip(alpha + beta * (H_t - H_init), 0, 1)."""
    return min(1.0, max(0.0, alpha + beta * (entropy - initial_entropy)))


# (H_t of the turn, H_init of the trajectory, consecutive branches just before) -> the branch probability
BranchRule = Callable[[float, float, int], float]


def arpo_rule(alpha: float = 0.5, beta: float = 0.2) -> BranchRule:
    """ARPO's rule: `branch_probability`, whatever the trajectory branched before."""
    return lambda entropy, initial_entropy, streak: branch_probability(entropy, initial_entropy, alpha, beta)


@dataclass
class ArpoStats:
    """Branching counts for logging (the tree's, under ARPO and AEPO alike)."""

    initial: int = 0
    branch_points: int = 0  # turns generated right after a tool response
    branches: int = 0
    fills: int = 0
    rounds: int = 0
    mean_branch_probability: float = 0.0

    def as_metrics(self) -> dict[str, float]:
        return {
            "arpo/initial_rollouts": self.initial,
            "arpo/branch_points": self.branch_points,
            "arpo/branches": self.branches,
            "arpo/fill_rollouts": self.fills,
            "arpo/rounds": self.rounds,
            "arpo/mean_branch_probability": self.mean_branch_probability,
        }


@dataclass
class _Sample:
    episode: Any
    query_pos: int
    initial_entropy: float | None = None
    done: bool = False
    branchable: bool = True
    streak: int = 0  # consecutive branch points, just before now, at which this trajectory's path branched


@dataclass
class ArpoGroups:
    """Finished episodes grouped per query (in the order of the queries), with the branching counts (and, from AEPO,
    its own metrics in `extra`)."""

    groups: list[list[Any]] = field(default_factory=list)
    stats: ArpoStats = field(default_factory=ArpoStats)
    extra: dict[str, float] = field(default_factory=dict)


def _run_rounds(
    engine: BranchingEngine, samples: list[_Sample], budget: list[int], used: list[int],
    rule: BranchRule, rng: random.Random, stats: ArpoStats, probabilities: list[float],
) -> None:
    """Advance every active sample one turn per round, branching after tool responses, until all are done. A branch
    continues its source's path, so it starts with the source's streak (this branch point included); a branch point
    that does not branch ends the streak."""
    while True:
        active = [s for s in samples if not s.done]
        if not active:
            return
        infos = engine.advance([s.episode for s in active])
        stats.rounds += 1
        for sample, info in zip(active, infos):
            if sample.initial_entropy is None:
                sample.initial_entropy = info.entropy
            elif info.after_tool and sample.branchable:
                stats.branch_points += 1
                p = rule(info.entropy, sample.initial_entropy, sample.streak)
                probabilities.append(p)
                if used[sample.query_pos] < budget[sample.query_pos] and rng.random() < p:
                    used[sample.query_pos] += 1
                    stats.branches += 1
                    sample.streak += 1
                    samples.append(_Sample(engine.branch(sample.episode), sample.query_pos, sample.initial_entropy,
                                           streak=sample.streak))
                else:
                    sample.streak = 0
            sample.done = info.done


def branching_rollouts(
    engine: BranchingEngine,
    queries: Sequence[Any],
    *,
    budget: int,
    initial_rollouts: Sequence[int],
    rule: BranchRule,
    rng: random.Random,
) -> ArpoGroups:
    """The tree of partial rollouts that ARPO and AEPO share: query q starts `initial_rollouts[q]` full rollouts,
    which branch after tool responses with the probability `rule` gives while the query's `budget` allows; the rest
    of the budget is then filled with fresh full rollouts (which never branch). Every query gets exactly `budget`
    finished episodes."""
    if len(initial_rollouts) != len(queries):
        raise ValueError(f"need one initial rollout count per query, got {len(initial_rollouts)} for {len(queries)}")
    for n in initial_rollouts:
        if not 0 < n <= budget:
            raise ValueError(f"need 0 < initial_rollouts <= budget, got N={n}, M={budget}")
    stats = ArpoStats()
    budgets = [budget] * len(queries)
    used = list(initial_rollouts)
    samples = [_Sample(ep, q) for q, (query, n) in enumerate(zip(queries, initial_rollouts))
               for ep in engine.start(query, n)]
    stats.initial = len(samples)
    probabilities: list[float] = []
    _run_rounds(engine, samples, budgets, used, rule, rng, stats, probabilities)

    fills: list[_Sample] = []
    for q, query in enumerate(queries):
        missing = budget - used[q]
        if missing > 0:
            fills += [_Sample(ep, q, branchable=False) for ep in engine.start(query, missing)]
            used[q] = budget
    stats.fills = len(fills)
    _run_rounds(engine, fills, budgets, used, rule, rng, stats, probabilities)

    groups: list[list[Any]] = [[] for _ in queries]
    for sample in samples + fills:
        groups[sample.query_pos].append(sample.episode)
    stats.mean_branch_probability = sum(probabilities) / len(probabilities) if probabilities else 0.0
    return ArpoGroups(groups=groups, stats=stats)


def arpo_rollouts(
    engine: BranchingEngine,
    queries: Sequence[Any],
    *,
    budget: int = 16,
    initial_rollouts: int = 8,
    alpha: float = 0.5,
    beta: float = 0.2,
    rng: random.Random,
) -> ArpoGroups:
    """Run ARPO's adaptive rollouts for a batch of queries: N full rollouts per query, ARPO's branch rule; every
    query gets exactly `budget` finished episodes."""
    return branching_rollouts(engine, queries, budget=budget, initial_rollouts=[initial_rollouts] * len(queries),
                              rule=arpo_rule(alpha, beta), rng=rng)
