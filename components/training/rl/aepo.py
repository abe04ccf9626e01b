"""AEPO's dynamic entropy-balanced rollout (Dong et al., 2025, "Agentic Entropy-Balanced Policy Optimization",
arXiv 2510.14545, by the ARPO authors), on ARPO's tree of partial rollouts (`arpo.branching_rollouts`).

Per query, with a budget of k samples:
1. entropy pre-monitoring: one full rollout of the query (no branching, not trained on) measures H_root, the entropy
   of the first turn's head, and H_tool, the mean head entropy of the turns generated after a tool response; the
   budget is split into m global samples (full rollouts from the question) and k - m branch samples,

       m = k * sigmoid(beta * (H_root - mean(H_tool)))

   so a question more uncertain than its tool feedback gets more global samples, and the reverse keeps more of the
   budget for branching after tool calls;
2. entropy-balanced adaptive rollout: the m rollouts branch as in ARPO, but after l consecutive branch points at
   which the trajectory's path branched, the branch probability is lowered by the penalty P(l):

       P_t = clip((alpha + beta * dH_t) * (1 - P(l)), 0, 1),     P(l) = min(1, branch_penalty * l)

   which stops the budget from collapsing onto one chain of consecutive high-entropy tool calls (alpha, beta and
   dH_t = H_t - H_init are ARPO's, `arpo.py`; the paper writes this beta as gamma and uses beta for the sensitivity
   of the split above, `aepo.allocation_beta` here);
3. the rest of the budget is filled with fresh full rollouts, as in ARPO.

Sources: the formulas of m and P_t are the paper's (Section "Dynamic Entropy-Balanced Rollout": "Entropy
Pre-Monitoring" and "Entropy-Balanced Adaptive Rollout"); the form of P(l) (linear, 0.05 per consecutive branch) and
beta = 0.5 follow the authors' public implementation (RUC-NLPIR/ARPO, AEPO's `vllm_rollout_with_tools.py`), which
rounds m as floor(k * sigmoid) + 1; here m is rounded up (ceil, at least 1), the same except where k * sigmoid is a
whole number (H_root = mean H_tool: m = k / 2, as the formula gives). Counting l per trajectory path (that
implementation counts the rounds in which a query branched) and measuring entropies in nats like this repository's
ARPO (it divides them by log |V|) are this implementation's choices. The policy-update half of AEPO is
`losses.entropy_balanced_surrogate_loss` and `advantages.entropy_aware_advantages`.
"""
from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from components.training.rl.arpo import ArpoGroups, BranchingEngine, BranchRule, branching_rollouts


def global_rollouts(budget: int, root_entropy: float, tool_entropy: float, beta: float = 0.5) -> int:
    """m = k * sigmoid(beta * (H_root - mean H_tool)), AEPO's entropy pre-monitoring split of the budget k into m
    global samples (paper, "Entropy Pre-Monitoring"), rounded up and kept in [1, k] (a query always starts at least
    one full rollout)."""
    share = 1.0 / (1.0 + math.exp(-beta * (root_entropy - tool_entropy)))
    return max(1, min(budget, math.ceil(budget * share)))


def consecutive_branch_penalty(streak: int, branch_penalty: float = 0.05) -> float:
    """P(l) = branch_penalty * l, at most 1: the penalty after l consecutive branches (the authors' code's form)."""
    return min(1.0, branch_penalty * streak)


def penalised_branch_probability(entropy: float, initial_entropy: float, streak: int, alpha: float = 0.5,
                                 beta: float = 0.2, branch_penalty: float = 0.05) -> float:
    """P_t = clip((alpha + beta * (H_t - H_init)) * (1 - P(l)), 0, 1): ARPO's branch probability lowered after l
    consecutive branches (paper, "Entropy-Balanced Adaptive Rollout", which writes the entropy weight as gamma)."""
    raw = (alpha + beta * (entropy - initial_entropy)) * (1.0 - consecutive_branch_penalty(streak, branch_penalty))
    return min(1.0, max(0.0, raw))


def aepo_rule(alpha: float = 0.5, beta: float = 0.2, branch_penalty: float = 0.05) -> BranchRule:
    """AEPO's branch rule for the shared tree (`penalised_branch_probability`; branch_penalty 0 gives ARPO's)."""
    return lambda entropy, initial_entropy, streak: penalised_branch_probability(
        entropy, initial_entropy, streak, alpha, beta, branch_penalty)


@dataclass
class EntropyProfile:
    """What entropy pre-monitoring measured on one full rollout of a query."""

    root: float = 0.0  # H_root: the head entropy of the first turn (the model facing the question)
    tool: list[float] = field(default_factory=list)  # H_tool^i: the head entropy of each turn after a tool response

    @property
    def tool_mean(self) -> float:
        """mean(H_tool); H_root when the rollout called no tool (then m = k * sigmoid(0), half the budget)."""
        return sum(self.tool) / len(self.tool) if self.tool else self.root


def monitor_entropies(engine: BranchingEngine, queries: Sequence[Any]) -> list[EntropyProfile]:
    """Entropy pre-monitoring: one full rollout per query, all of them advanced together one turn per round and
    never branched; returns each query's H_root and after-tool entropies. The rollouts are then discarded."""
    episodes = [engine.start(query, 1)[0] for query in queries]
    profiles = [EntropyProfile() for _ in queries]
    seen_first = [False] * len(queries)
    active = list(range(len(queries)))
    while active:
        infos = engine.advance([episodes[i] for i in active])
        for i, info in zip(active, infos):
            if not seen_first[i]:
                profiles[i].root, seen_first[i] = info.entropy, True
            elif info.after_tool:
                profiles[i].tool.append(info.entropy)
        active = [i for i, info in zip(active, infos) if not info.done]
    return profiles


def aepo_rollouts(
    engine: BranchingEngine,
    queries: Sequence[Any],
    *,
    budget: int = 16,
    initial_rollouts: int = 8,
    alpha: float = 0.5,
    beta: float = 0.2,
    branch_penalty: float = 0.05,
    dynamic_rollouts: bool = True,
    allocation_beta: float = 0.5,
    rng: random.Random,
) -> ArpoGroups:
    """AEPO's dynamic entropy-balanced rollout for a batch of queries: with `dynamic_rollouts` each query starts the
    m full rollouts its pre-monitoring allocates (else `initial_rollouts`, ARPO's fixed N), which branch under AEPO's
    penalised rule; every query gets exactly `budget` finished episodes. `extra` holds the split's metrics."""
    extra: dict[str, float] = {}
    if dynamic_rollouts:
        profiles = monitor_entropies(engine, queries)
        starts = [global_rollouts(budget, p.root, p.tool_mean, allocation_beta) for p in profiles]
        n = max(len(profiles), 1)
        extra = {"aepo/monitor_rollouts": len(profiles),
                 "aepo/root_entropy": sum(p.root for p in profiles) / n,
                 "aepo/tool_entropy": sum(p.tool_mean for p in profiles) / n}
    else:
        starts = [initial_rollouts] * len(queries)
    result = branching_rollouts(engine, queries, budget=budget, initial_rollouts=starts,
                                rule=aepo_rule(alpha, beta, branch_penalty), rng=rng)
    result.extra = {"aepo/global_rollouts": sum(starts) / max(len(starts), 1), **extra}
    return result
