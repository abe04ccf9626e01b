"""The six official TravelPlanner metrics over a query set, plus per-check and per-level/duration breakdowns.

N is fixed by the query set: a query without an evaluation (no plan delivered) counts as a failure everywhere.
`ci95` gives the 95% Wilson interval of each per-query rate (delivery, the two macro rates, final pass).
Hard micro = passed hard checks / (N + number of set local constraints): budget counts for every query, each other
hard check only where the query sets it (the official denominators, e.g. 105 for the 45 training queries).
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from components.stats import rate_interval
from components.travel.evaluate import COMMONSENSE_CHECKS, HARD_CHECKS, PlanEvaluation
from components.travel.tasks import Query

METRIC_KEYS = ("delivery_rate", "commonsense_micro", "commonsense_macro", "hard_micro", "hard_macro", "final_pass")
PER_QUERY_RATES = ("delivery_rate", "commonsense_macro", "hard_macro", "final_pass")  # `ci95` holds their intervals


def summarize(queries: Sequence[Query], evaluations: Mapping[int, PlanEvaluation] | Sequence[PlanEvaluation | None],
              breakdowns: bool = True) -> dict[str, Any]:
    """The metrics of one evaluator mode. `evaluations` maps query idx -> evaluation (or is aligned with queries)."""
    by_idx = _align(queries, evaluations)
    n = len(queries)
    if n == 0:
        return {key: 0.0 for key in METRIC_KEYS} | {"n": 0, "per_check": {}}
    delivered = cs_passed = cs_macro = hard_passed = hard_macro = final = 0
    hard_total = 0
    per_check = {name: 0 for name in (*COMMONSENSE_CHECKS, *HARD_CHECKS)}
    per_check_total = {name: 0 for name in per_check}
    for query in queries:
        evaluation = by_idx.get(query.idx)
        applicable = ["valid_cost", *(_HARD_OF[key] for key in query.set_constraints())]
        hard_total += len(applicable)
        for name in COMMONSENSE_CHECKS:
            per_check_total[name] += 1
        for name in applicable:
            per_check_total[name] += 1
        if evaluation is None or not evaluation.delivered:
            continue
        delivered += 1
        passed_cs = [name for name in COMMONSENSE_CHECKS if evaluation.commonsense[name].passed]
        passed_hard = [name for name in applicable if evaluation.hard[name].passed]
        for name in (*passed_cs, *passed_hard):
            per_check[name] += 1
        cs_passed += len(passed_cs)
        hard_passed += len(passed_hard)
        cs_macro += evaluation.commonsense_pass
        hard_ok = len(passed_hard) == len(applicable)
        hard_macro += hard_ok
        final += evaluation.commonsense_pass and hard_ok
    out: dict[str, Any] = {
        "n": n,
        "delivery_rate": delivered / n,
        "commonsense_micro": cs_passed / (len(COMMONSENSE_CHECKS) * n),
        "commonsense_macro": cs_macro / n,
        "hard_micro": hard_passed / hard_total,
        "hard_macro": hard_macro / n,
        "final_pass": final / n,
        "per_check": {name: per_check[name] / per_check_total[name]
                      for name in per_check if per_check_total[name]},
    }
    if breakdowns:
        # 95% Wilson intervals of the per-query rates (micro rates count checks, not independent queries: none)
        out["ci95"] = {key: rate_interval(out[key], n) for key in PER_QUERY_RATES}
        out["by_level"] = _breakdown(queries, by_idx, lambda q: q.level)
        out["by_days"] = _breakdown(queries, by_idx, lambda q: str(q.days))
    return out


_HARD_OF = {"house rule": "valid_room_rule", "room type": "valid_room_type", "cuisine": "valid_cuisine",
            "transportation": "valid_transportation"}


def _align(queries: Sequence[Query], evaluations: Any) -> dict[int, PlanEvaluation]:
    if isinstance(evaluations, Mapping):
        return dict(evaluations)
    evaluations = list(evaluations)
    if len(evaluations) != len(queries):
        raise ValueError(f"{len(evaluations)} evaluations for {len(queries)} queries: pass a dict idx -> evaluation "
                         "or one entry (None for a missing plan) per query")
    return {q.idx: e for q, e in zip(queries, evaluations) if e is not None}


def _breakdown(queries: Sequence[Query], by_idx: dict[int, PlanEvaluation], key) -> dict[str, dict[str, Any]]:
    groups: dict[str, list[Query]] = {}
    for query in queries:
        groups.setdefault(key(query), []).append(query)
    return {name: {metric: value for metric, value in summarize(group, by_idx, breakdowns=False).items()
                   if metric != "per_check"}
            for name, group in sorted(groups.items())}


def summarize_modes(queries: Sequence[Query], evaluations: Iterable[Mapping[str, PlanEvaluation] | None]) -> dict:
    """The file contract `{"n": N, "strict": {...}, "official": {...}}` from per-query {mode: evaluation} dicts."""
    evaluations = list(evaluations)
    out: dict[str, Any] = {"n": len(queries)}
    for mode in ("strict", "official"):
        out[mode] = summarize(queries, [e.get(mode) if e else None for e in evaluations])
    return out
