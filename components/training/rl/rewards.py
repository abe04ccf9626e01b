"""From a finished rollout to its scalar reward: the environment's task reward plus DAPO's overlong shaping.

The loop's `evaluate` callback (the task source's) stores the rollout's evaluation in its record; the task source's
`reward(record, progress)` turns it into a `TaskReward` (travel: the STAR reward kinds over the strict evaluation;
Tool-Star: its hierarchical reward), and `trajectory_reward` adds the length shaping every environment shares.
"""
from __future__ import annotations

from dataclasses import dataclass

from components.agent.environment import TaskSource
from components.training.rl.dapo import overlong_penalty
from components.training.rl.params import RLParams


def sampled_length(record: dict) -> int:
    """Number of tokens the policy sampled in the episode (sum of the response mask)."""
    return int(sum(record.get("response_mask") or []))


@dataclass(frozen=True)
class TrajectoryReward:
    """The reward the advantage uses (`total`), and what it is made of."""

    total: float
    task: float  # the environment's reward (or its format reward)
    overlong: float  # DAPO's shaping term (0 when disabled)
    kind: str  # the reward kind used (CURRICULUM resolved to its stage)
    components: dict[str, float]
    format_applied: bool

    def row(self) -> dict[str, float]:
        return {"reward": self.total, "task_reward": self.task, "overlong": self.overlong, **self.components,
                "format_error": float(self.format_applied)}


def overlong_shaping(record: dict, params: RLParams) -> float:
    """DAPO's overlong shaping term of a rollout (0 when `overlong` is off)."""
    if not params.overlong.enabled:
        return 0.0
    return params.overlong.coefficient * overlong_penalty(
        sampled_length(record), params.overlong.max_tokens, params.overlong.cache_tokens)


def trajectory_reward(source: TaskSource, record: dict, params: RLParams, progress: float) -> TrajectoryReward:
    """The reward of one finished rollout at training progress `progress` in [0, 1]: the task source's reward plus
    the overlong shaping."""
    task = source.reward(record, progress)
    shaping = overlong_shaping(record, params)
    return TrajectoryReward(total=task.value + shaping, task=task.value, overlong=shaping, kind=task.kind,
                            components=dict(task.components), format_applied=task.format_applied)
