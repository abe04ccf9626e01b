"""RL rewards from a (strict) plan evaluation.

Five components per trajectory: cs_micro (passed / 8), hard_micro (passed / applicable), cs_macro, hard_macro and
success (0 or 1). SUM is their (weighted) mean, MACRO the mean of cs_macro, hard_macro and success, SUCCESS the
success bit, CURRICULUM switches SUM -> MACRO -> SUCCESS at the training-progress boundaries. A trajectory with no
parseable plan, or one that ended on a protocol failure, gets the format reward instead.

Commonsense credit goes only to a plan with its days filled: one that passes `is_not_absent` (every day of the query
present, each with the transport, meals, attraction and accommodation it needs). Several checks pass on emptiness,
so without this gate a plan of days holding only `current_city` would earn SUM 0.15 (6 of 8 checks), more than an
honest attempt that fails. The hard checks have the same gate in the evaluator, and MACRO and SUCCESS need every
commonsense check, so all three kinds give such a plan 0.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

from pydantic import field_validator

from components.agent.environment import RewardParams as EnvironmentRewardParams
from components.travel.evaluate import COMMONSENSE_CHECKS, PlanEvaluation

KINDS = ("sum", "macro", "success", "curriculum")
COMPONENTS = ("cs_micro", "hard_micro", "cs_macro", "hard_macro", "success")
FILLED_DAYS_CHECK = "is_not_absent"  # the gate of commonsense credit (and, in the evaluator, of the hard checks)


@dataclass(frozen=True)
class RewardWeights:
    """Weights of the five components in SUM (equal weights = the plain mean) and in MACRO (its three)."""

    cs_micro: float = 1.0
    hard_micro: float = 1.0
    cs_macro: float = 1.0
    hard_macro: float = 1.0
    success: float = 1.0


class RewardParams(EnvironmentRewardParams):
    """`rl.reward` of a travel run: how a strict evaluation becomes a scalar reward."""

    kind: Literal["sum", "macro", "success", "curriculum"] = "sum"
    format_reward: float = 0.0  # for no parseable plan or a protocol failure (0 by default; may be negative)
    curriculum_boundaries: tuple[float, float] = (1 / 3, 2 / 3)  # SUM before, MACRO between, SUCCESS after
    weights: dict[str, float] | None = None  # component -> weight for SUM/MACRO (None: equal weights)

    @field_validator("weights")
    @classmethod
    def _known_components(cls, weights: dict[str, float] | None) -> dict[str, float] | None:
        unknown = set(weights or {}) - set(COMPONENTS)
        if unknown:
            raise ValueError(f"unknown components {sorted(unknown)}; use {list(COMPONENTS)}")
        return weights

    def reward_weights(self) -> RewardWeights | None:
        """`weights` as RewardWeights (None: equal weights)."""
        return None if self.weights is None else RewardWeights(**self.weights)


@dataclass(frozen=True)
class RewardBreakdown:
    """The scalar reward, the kind actually used (CURRICULUM resolves to a stage) and every component."""

    reward: float
    kind: str
    cs_micro: float = 0.0
    hard_micro: float = 0.0
    cs_macro: float = 0.0
    hard_macro: float = 0.0
    success: float = 0.0
    format: float = 0.0
    format_applied: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


def components(evaluation: PlanEvaluation) -> dict[str, float]:
    """The five reward components of one evaluation (cs_micro 0 unless the plan has its days filled)."""
    days_filled = evaluation.commonsense[FILLED_DAYS_CHECK].passed
    cs_passed = sum(evaluation.commonsense[name].passed for name in COMMONSENSE_CHECKS) if days_filled else 0
    applicable = [r for r in evaluation.hard.values() if r.status != "n/a"]
    hard_passed = sum(r.passed for r in applicable)
    return {
        "cs_micro": cs_passed / len(COMMONSENSE_CHECKS),
        "hard_micro": hard_passed / len(applicable) if applicable else 1.0,
        "cs_macro": float(evaluation.commonsense_pass),
        "hard_macro": float(evaluation.hard_pass),
        "success": float(evaluation.final_pass),
    }


def curriculum_stage(progress: float, boundaries: tuple[float, float] = (1 / 3, 2 / 3)) -> str:
    """SUM before the first boundary, MACRO before the second, SUCCESS after (progress in [0, 1])."""
    first, second = boundaries
    if not 0.0 <= first <= second <= 1.0:
        raise ValueError(f"curriculum boundaries must satisfy 0 <= first <= second <= 1, got {boundaries}")
    if progress < first:
        return "sum"
    if progress < second:
        return "macro"
    return "success"


def _weighted_mean(values: dict[str, float], weights: RewardWeights, names: tuple[str, ...]) -> float:
    total = sum(getattr(weights, name) for name in names)
    if total <= 0:
        raise ValueError(f"reward weights of {names} must sum to a positive number, got {weights}")
    return sum(getattr(weights, name) * values[name] for name in names) / total


def reward(evaluation: PlanEvaluation | None, kind: str, progress: float = 0.0, weights: RewardWeights | None = None,
           curriculum_boundaries: tuple[float, float] = (1 / 3, 2 / 3), format_reward: float = 0.0,
           protocol_failure: bool = False) -> RewardBreakdown:
    """The reward of one trajectory. `kind` is sum | macro | success | curriculum (case-insensitive)."""
    kind = kind.lower()
    if kind not in KINDS:
        raise ValueError(f"reward kind must be one of {KINDS}, got {kind!r}")
    used = curriculum_stage(progress, curriculum_boundaries) if kind == "curriculum" else kind
    if evaluation is None or not evaluation.delivered or evaluation.plan_error or protocol_failure:
        return RewardBreakdown(reward=format_reward, kind=used, format=format_reward, format_applied=True)
    weights = weights or RewardWeights()
    values = components(evaluation)
    if used == "sum":
        value = _weighted_mean(values, weights, COMPONENTS)
    elif used == "macro":
        value = _weighted_mean(values, weights, ("cs_macro", "hard_macro", "success"))
    else:
        value = values["success"]
    return RewardBreakdown(reward=value, kind=used, **values)
