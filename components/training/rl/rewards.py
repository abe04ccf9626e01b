"""From a finished rollout to its scalar reward: the strict evaluation, the STAR reward kind, DAPO's overlong shaping.

One evaluator serves filtering, rewards and validation: the loop's `evaluate` callback stores the strict
evaluation in the trajectory record (`record["evaluation"]["strict"]`), and the reward is computed from that record
by `components.travel.rewards.reward` (SUM / MACRO / SUCCESS / CURRICULUM, or the format reward for a trajectory with
no parseable plan or a protocol failure). A Tool-Star rollout (`rl.env.kind: toolstar`) is scored by
`components.evaluation.toolstar_rollout.score_episode` instead, and `toolstar_reward` reads that evaluation.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from components.training.rl.dapo import overlong_penalty
from components.training.rl.params import RLParams
from components.travel.evaluator import PlanEvaluation, evaluate_plan
from components.travel.rewards import COMPONENTS, RewardWeights, reward

PROTOCOL_FAILURES = ("protocol_errors",)


def strict_evaluation(world, query, record: dict) -> dict:
    """The `evaluation` field of a rollout record: the strict evaluation of its plan (None plans included)."""
    return {"strict": evaluate_plan(world, query, record.get("plan"), mode="strict").to_dict()}


def reward_weights(params: RLParams) -> RewardWeights | None:
    """params.reward.weights as RewardWeights (None: equal weights)."""
    if params.reward.weights is None:
        return None
    unknown = set(params.reward.weights) - set(COMPONENTS)
    if unknown:
        raise ValueError(f"rl.reward.weights has unknown components {sorted(unknown)}; use {list(COMPONENTS)}")
    return RewardWeights(**params.reward.weights)


def sampled_length(record: dict) -> int:
    """Number of tokens the policy sampled in the episode (sum of the response mask)."""
    return int(sum(record.get("response_mask") or []))


@dataclass(frozen=True)
class TrajectoryReward:
    """The reward the advantage uses (`total`), and what it is made of."""

    total: float
    task: float  # the STAR reward (or the format reward)
    overlong: float  # DAPO's shaping term (0 when disabled)
    kind: str  # the reward kind used (CURRICULUM resolved to its stage)
    components: dict[str, float]
    format_applied: bool

    def row(self) -> dict[str, float]:
        return {"reward": self.total, "task_reward": self.task, "overlong": self.overlong, **self.components,
                "format_error": float(self.format_applied)}


def trajectory_reward(record: dict, params: RLParams, progress: float) -> TrajectoryReward:
    """The reward of one finished rollout at training progress `progress` in [0, 1]."""
    strict = (record.get("evaluation") or {}).get("strict")
    evaluation = PlanEvaluation.from_dict(strict) if strict else None
    breakdown = reward(
        evaluation, params.reward.kind, progress=progress, weights=reward_weights(params),
        curriculum_boundaries=tuple(params.reward.curriculum_boundaries), format_reward=params.reward.format_reward,
        protocol_failure=record.get("termination") in PROTOCOL_FAILURES,
    )
    shaping = overlong_shaping(record, params)
    comps = {name: float(getattr(breakdown, name)) for name in COMPONENTS}
    return TrajectoryReward(total=breakdown.reward + shaping, task=breakdown.reward, overlong=shaping,
                            kind=breakdown.kind, components=comps, format_applied=breakdown.format_applied)


def overlong_shaping(record: dict, params: RLParams) -> float:
    """DAPO's overlong shaping term of a rollout (0 when `overlong` is off)."""
    if not params.overlong.enabled:
        return 0.0
    return params.overlong.coefficient * overlong_penalty(
        sampled_length(record), params.overlong.max_tokens, params.overlong.cache_tokens)


def toolstar_reward(record: dict, params: RLParams) -> TrajectoryReward:
    """The reward of a finished Tool-Star rollout: Tool-Star's (its `evaluation`, from `score_episode`: -1 for a
    format error, else the answer's score plus the multi-tool bonus) plus DAPO's overlong shaping. Components:
    `success` (a correct answer), `score`, `bonus`, `em`, `f1`."""
    evaluation = record.get("evaluation") or {}
    if "reward" not in evaluation:
        raise ValueError(f"rollout {record.get('idx', '?')} has no Tool-Star evaluation (score_episode)")
    task = float(evaluation["reward"])
    shaping = overlong_shaping(record, params)
    comps = {"success": float(evaluation["correct"]), "score": float(evaluation["score"]),
             "bonus": float(evaluation["bonus"]), "em": float(evaluation["em"]), "f1": float(evaluation["f1"])}
    return TrajectoryReward(total=task + shaping, task=task, overlong=shaping, kind="toolstar", components=comps,
                            format_applied=not evaluation["format_ok"])


def toolstar_check_rates(records: Sequence[dict]) -> dict[str, float]:
    """Shares of Tool-Star rollouts that kept the format, answered, answered correctly, and used both tools."""
    n = max(len(records), 1)
    evaluations = [r.get("evaluation") or {} for r in records]
    return {"format_ok": sum(bool(e.get("format_ok")) for e in evaluations) / n,
            "answered": sum(r.get("termination") == "answer" for r in records) / n,
            "correct": sum(bool(e.get("correct")) for e in evaluations) / n,
            "multi_tool": sum(e.get("bonus", 0.0) > 0 for e in evaluations) / n}


def check_pass_rates(records: Sequence[dict]) -> dict[str, float]:
    """Per check, the share of rollouts where it passed (n/a hard checks are left out of their denominator)."""
    passed: dict[str, int] = {}
    seen: dict[str, int] = {}
    for record in records:
        strict = (record.get("evaluation") or {}).get("strict") or {}
        for block in ("commonsense", "hard"):
            for name, result in (strict.get(block) or {}).items():
                if result["status"] == "n/a":
                    continue
                seen[name] = seen.get(name, 0) + 1
                passed[name] = passed.get(name, 0) + int(result["status"] == "pass")
    return {name: passed[name] / seen[name] for name in sorted(seen)}
