"""Rollout samplers: how an RL step's scored groups are drawn, registered by the name an algorithm's `sampler` gives
(components/training/rl/algorithms.py).

Every sampler is a function `(SamplerInputs) -> StepBatch`:
- `groups`: G = num_generations rollouts per query in one batch through the agent loop (GRPO, Dr.GRPO);
- `dapo`: the same groups, tied ones dropped and more queries drawn until the step holds informative groups;
- `arpo`: ARPO's tree, branching after high-entropy tool responses (arpo.budget trajectories per query);
- `aepo`: AEPO's tree: entropy pre-monitoring and the consecutive-branch penalty on ARPO's.

A new algorithm with a sampler of its own is one module and one registration (docs/architecture.md, "Adding an
algorithm"):

    from components.training.rl.algorithms import Algorithm
    from components.training.rl.samplers import StepBatch, add_algorithm

    def sample_mine(inputs) -> StepBatch: ...

    add_algorithm(Algorithm(name="mine", sampler="mine"), sample_mine)
"""
from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from components.agent.environment import TaskSource
from components.training.rl.algorithms import Algorithm, register_algorithm, unregister_algorithm
from components.training.rl.aepo import aepo_rollouts
from components.training.rl.arpo import ArpoGroups, arpo_rollouts
from components.training.rl.dapo import dynamic_sampling
from components.training.rl.distributed import SINGLE, Ranks
from components.training.rl.engine import RolloutEngine
from components.training.rl.params import RLParams
from components.training.rl.registry import add, lookup
from components.training.rl.rewards import TrajectoryReward, trajectory_reward


@dataclass
class Scored:
    """A finished rollout and its reward."""

    record: dict
    reward: TrajectoryReward


@dataclass
class StepBatch:
    groups: list[list[Scored]] = field(default_factory=list)  # what the update trains on
    sampled: list[list[Scored]] = field(default_factory=list)  # everything rolled out (DAPO's dropped groups too)
    rollout_seconds: float = 0.0
    extra: dict = field(default_factory=dict)  # the sampler's statistics, logged as they are named


@dataclass
class SamplerInputs:
    """What a sampler draws a step from: `queries` are this rank's share of the step, `next_queries(n)` this rank's
    share of the next n queries of the cursor (DAPO's extra rounds), `progress` the training progress the reward
    reads, `rng` the step's seeded generator and `ranks` the data-parallel world."""

    engine: RolloutEngine
    queries: list
    next_queries: Callable[[int], list]
    params: RLParams
    progress: float
    rng: random.Random
    ranks: Ranks = SINGLE


Sampler = Callable[[SamplerInputs], StepBatch]
SAMPLERS: dict[str, Sampler] = {}


def register_sampler(name: str, sampler: Sampler) -> Sampler:
    """Add `sampler` under `name` (a name already registered is refused)."""
    return add(SAMPLERS, name, sampler, "sampler")


def unregister_sampler(name: str) -> None:
    SAMPLERS.pop(name, None)


def add_algorithm(algorithm: Algorithm, sampler: Sampler | None = None) -> Algorithm:
    """Register `algorithm` and, when given, `sampler` under the algorithm's sampler name (one call for an algorithm
    that samples in a way of its own)."""
    if sampler is not None:
        register_sampler(algorithm.sampler, sampler)
    elif algorithm.sampler not in SAMPLERS:
        raise ValueError(f"algorithm {algorithm.name!r} names sampler {algorithm.sampler!r}, which is not registered: "
                         f"pass its function, or name one of {', '.join(SAMPLERS)}")
    return register_algorithm(algorithm)


def remove_algorithm(name: str) -> None:
    """Unregister the algorithm `name` and the sampler it brought (the registered samplers of other algorithms
    stay)."""
    from components.training.rl.algorithms import ALGORITHMS

    algorithm = ALGORITHMS.get(name)
    unregister_algorithm(name)
    if algorithm is not None and not any(a.sampler == algorithm.sampler for a in ALGORITHMS.values()):
        unregister_sampler(algorithm.sampler)


def get_sampler(name: str) -> Sampler:
    return lookup(SAMPLERS, name, "sampler")


def score_groups(groups: list[list[dict]], params: RLParams, progress: float,
                 source: TaskSource) -> list[list[Scored]]:
    """Each rollout with its reward (the task source's, plus the overlong shaping)."""
    return [[Scored(r, trajectory_reward(source, r, params, progress)) for r in group] for group in groups]


def group_task_rewards(group: list[Scored]) -> list[float]:
    """What DAPO's dynamic sampling filters a group on: its task rewards, without the overlong shaping (the DAPO
    recipe filters on accuracy; episodes that fail alike but differ in length are still a tied group)."""
    return [s.reward.task for s in group]


def collect_rollouts(inputs: SamplerInputs) -> StepBatch:
    """The step's scored groups by the algorithm's sampler, timed."""
    start = time.perf_counter()
    batch = get_sampler(inputs.params.spec.sampler)(inputs)
    batch.rollout_seconds = time.perf_counter() - start
    return batch


def sample_groups(inputs: SamplerInputs) -> StepBatch:
    """`groups`: num_generations rollouts of every query, in one batch."""
    engine, params = inputs.engine, inputs.params
    groups = score_groups(engine.groups(inputs.queries, params.num_generations), params, inputs.progress,
                          engine.source)
    return StepBatch(groups=groups, sampled=groups)


def sample_dapo(inputs: SamplerInputs) -> StepBatch:
    """`dapo`: groups of num_generations, tied ones dropped, refilled from the cursor for up to
    dynamic_sampling.max_extra_rounds rounds (decided over the whole world: each round asks for the groups still
    missing on all ranks together)."""
    engine, params = inputs.engine, inputs.params
    batch = StepBatch()
    pending = [list(inputs.queries)]

    def sample(n: int) -> list[list[Scored]]:
        chosen = pending.pop() if pending else inputs.next_queries(n)
        groups = score_groups(engine.groups(chosen[:n], params.num_generations), params, inputs.progress,
                              engine.source)
        batch.sampled.extend(groups)
        return groups

    result = dynamic_sampling(sample, group_task_rewards, params.queries_per_step,
                              params.dynamic_sampling.max_extra_rounds,
                              total=lambda n: int(inputs.ranks.sum([n])[0]))
    batch.groups = result.groups
    batch.extra = {"dapo/rounds": result.rounds, "dapo/sampled_groups": result.sampled_groups,
                   "dapo/dropped_groups": result.dropped_groups, "dapo/kept_groups": len(result.groups)}
    return batch


def tree_batch(inputs: SamplerInputs, result: ArpoGroups) -> StepBatch:
    """A branching tree's groups, scored, with its statistics."""
    records = [[ep.record for ep in group] for group in result.groups]
    groups = score_groups(records, inputs.params, inputs.progress, inputs.engine.source)
    return StepBatch(groups=groups, sampled=groups, extra={**result.stats.as_metrics(), **result.extra})


def sample_arpo(inputs: SamplerInputs) -> StepBatch:
    """`arpo`: ARPO's tree, arpo.budget trajectories per query from arpo.initial_rollouts full ones."""
    arpo = inputs.params.arpo
    return tree_batch(inputs, arpo_rollouts(inputs.engine, inputs.queries, budget=arpo.budget,
                                            initial_rollouts=arpo.initial_rollouts, alpha=arpo.alpha,
                                            beta=arpo.beta, rng=inputs.rng))


def sample_aepo(inputs: SamplerInputs) -> StepBatch:
    """`aepo`: AEPO's rule and budget split on ARPO's tree."""
    arpo, aepo = inputs.params.arpo, inputs.params.aepo
    return tree_batch(inputs, aepo_rollouts(
        inputs.engine, inputs.queries, budget=arpo.budget, initial_rollouts=arpo.initial_rollouts, alpha=arpo.alpha,
        beta=arpo.beta, branch_penalty=aepo.branch_penalty, dynamic_rollouts=aepo.dynamic_rollouts,
        allocation_beta=aepo.allocation_beta, rng=inputs.rng))


register_sampler("groups", sample_groups)
register_sampler("dapo", sample_dapo)
register_sampler("arpo", sample_arpo)
register_sampler("aepo", sample_aepo)
