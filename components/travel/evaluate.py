"""The TravelPlanner evaluator: 8 commonsense and 5 hard checks, in two modes.

- `official` reproduces the public evaluator (`commonsense_constraint.py` / `hard_constraint.py`) rule by rule,
  quirks included, so our numbers compare with published ones; where the public code would crash on a malformed
  plan, the affected check fails with the reason instead.
- `strict` (the default, used for rewards) fixes every quirk: every attraction and every day's city are checked,
  flights must exist on the day's date and leg, transport modes are detected case-insensitively and unknown ones
  fail, names must match a listing exactly and ambiguous names are resolved to the worst case.

Every lookup goes through the World's indexes (rows of one city), with a lazily filled per-world cache of name
matches; nothing scans a table.
"""
from __future__ import annotations

from typing import Any, Callable

from components.agent.loop import Episode, Evaluate
from components.travel.checks import (
    COMMONSENSE_CHECKS,
    HARD_CHECKS,
    HARD_CONSTRAINT_KEY,
    MODES,
    NOT_APPLICABLE,
    CheckResult,
    Context,
    PlanEvaluation,
    fail,
    lookup_for,
)
from components.travel.official_checks import OFFICIAL_COMMONSENSE, OFFICIAL_HARD
from components.travel.plans import (
    parse_plan,
)
from components.travel.tasks import Query
from components.travel.strict_checks import STRICT_COMMONSENSE, STRICT_HARD


def evaluate_plan(world: Any, query: Query, plan: Any, mode: str = "strict", lookup: Any = None) -> PlanEvaluation:
    """Score one plan against its query in `mode` ("strict" or "official"); never raises on a bad plan.

    `lookup` replaces the cached per-world `NameLookup` (same two methods); the benchmark passes a pandas one.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if _is_absent(plan):
        return _undelivered(query, mode, "no plan delivered")
    days, error = _as_days(plan)
    if days is None:  # text that is not a plan delivers nothing (an absent plan is not delivered)
        return _undelivered(query, mode, f"no plan delivered: {error}")
    ctx = Context(world, query, days, lookup or lookup_for(world))
    checks = OFFICIAL_COMMONSENSE if mode == "official" else STRICT_COMMONSENSE
    commonsense = {name: _guarded(checks[name], ctx) for name in COMMONSENSE_CHECKS}
    total_cost = None
    if commonsense["is_not_absent"].passed and commonsense["is_valid_information_in_sandbox"].passed:
        hard_checks = OFFICIAL_HARD if mode == "official" else STRICT_HARD
        hard = {}
        for name in HARD_CHECKS:
            if name != "valid_cost" and query.local_constraint.get(HARD_CONSTRAINT_KEY[name]) in (None, []):
                hard[name] = NOT_APPLICABLE
            else:
                hard[name] = _guarded(hard_checks[name], ctx)
        total_cost = ctx.total_cost
    else:
        hard = _gated_hard(query, "not evaluated: complete information and within-sandbox must pass first")
    return PlanEvaluation(mode, True, commonsense, hard, total_cost, None)

def _is_absent(plan: Any) -> bool:
    """No plan: None, or an empty list/str/dict (the official `if plan:`), without trusting `bool()` of odd types."""
    try:
        if isinstance(plan, (bool, int, float)):
            return not plan
        return plan is None or (isinstance(plan, (list, tuple, str, dict, bytes)) and len(plan) == 0)
    except TypeError:
        return False

def _as_days(plan: Any) -> tuple[list[dict] | None, str | None]:
    if isinstance(plan, list) and all(isinstance(day, dict) for day in plan):
        return plan, None
    return parse_plan(plan, normalize=False)

def _undelivered(query: Query, mode: str, reason: str) -> PlanEvaluation:
    commonsense = {name: fail(reason) for name in COMMONSENSE_CHECKS}
    return PlanEvaluation(mode, False, commonsense, _gated_hard(query, reason), None, reason)

def _gated_hard(query: Query, reason: str) -> dict[str, CheckResult]:
    out = {}
    for name in HARD_CHECKS:
        applicable = name == "valid_cost" or query.local_constraint.get(HARD_CONSTRAINT_KEY[name]) not in (None, [])
        out[name] = fail(reason) if applicable else NOT_APPLICABLE
    return out

def _guarded(check: Callable[["Context"], CheckResult], ctx: "Context") -> CheckResult:
    """Run a check; a malformed plan that trips it (where the public code crashes) fails it with the reason."""
    try:
        return check(ctx)
    except Exception as exc:  # noqa: BLE001 - any crash on plan content is that plan's failure, not ours
        return fail(f"malformed plan: {type(exc).__name__}: {exc}")

def evaluate_both(world: Any, query: Query, plan: Any) -> dict[str, PlanEvaluation]:
    """Both modes of one plan, keyed by mode (the trajectory record's "evaluation" field)."""
    return {mode: evaluate_plan(world, query, plan, mode) for mode in ("strict", "official")}


__all__ = [
    "CheckResult", "PlanEvaluation", "COMMONSENSE_CHECKS", "HARD_CHECKS", "MODES", "evaluate_plan",
    "evaluate_both", "lookup_for",
]


def travel_evaluate(world: Any) -> Evaluate:
    """The agent loop's evaluate callback of travel episodes: both evaluator modes on the record's final plan."""
    def evaluate(episode: Episode, record: dict) -> dict:
        query = episode.meta["query"]
        return {mode: result.to_dict() for mode, result in evaluate_both(world, query, record.get("plan")).items()}

    return evaluate
