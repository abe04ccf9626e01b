r"""`star evaluate`: score a plans file against its queries in official and/or strict mode.

    star evaluate --world data/world --queries data/queries/val.jsonl --plans plans.jsonl --mode both \
        --out eval.json

writes `{"n": N, "strict": {...}, "official": {...}}` to --out and one line per query (every check with its
reason) to `<out stem>.plans.jsonl` beside it, and prints the six metrics side by side.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from components.errors import UserError
from components.jsonl import iter_jsonl

# The evaluator, the world tables and tqdm are imported where they are used, so that `star --help` stays instant.

METRIC_LABELS = (
    ("delivery_rate", "Delivery rate"),
    ("commonsense_micro", "Commonsense micro"),
    ("commonsense_macro", "Commonsense macro"),
    ("hard_micro", "Hard micro"),
    ("hard_macro", "Hard macro"),
    ("final_pass", "Final pass rate"),
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("evaluate", help="score plans against queries (official and strict evaluator)",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", required=True, help="world directory (Parquet tables + manifest.json)")
    parser.add_argument("--queries", required=True, help="queries JSONL (or the official CSV)")
    parser.add_argument("--plans", required=True, help='plans JSONL: {"idx": i, "plan": [...] | "text"} per line')
    parser.add_argument("--mode", choices=("official", "strict", "both"), default="both")
    parser.add_argument("--out", required=True, help="metrics JSON to write")
    parser.add_argument("--raw", action="store_true",
                        help="score plans exactly as written (no key, list or '; Cost: 14'-style rewriting), "
                             "as the public evaluator sees them")
    parser.set_defaults(handler=run_evaluate)


def read_plans(path: str | Path) -> dict[int, Any]:
    """idx -> raw plan value from a plans JSONL file; errors name the line (a malformed line, an idx given twice,
    a file without plans)."""
    plans: dict[int, Any] = {}
    first_line: dict[int, int] = {}
    for line_no, record in iter_jsonl(path, missing_hint="the plans file: one {\"idx\", \"plan\"} object a line"):
        if not isinstance(record, dict) or "idx" not in record:
            raise UserError(f'{path}:{line_no}: each line must be an object {{"idx": i, "plan": [...]}}')
        try:
            idx = int(record["idx"])
        except (TypeError, ValueError):
            raise UserError(f"{path}:{line_no}: idx must be an integer, got {record['idx']!r}") from None
        if idx in plans:
            raise UserError(f"{path}:{line_no}: idx {idx} already has a plan (line {first_line[idx]}); give each "
                            "query one plan")
        plans[idx], first_line[idx] = record.get("plan"), line_no
    if not plans:
        raise UserError(f'{path} holds no plans: write one {{"idx": i, "plan": [...]}} object a line')
    return plans


def evaluate_file(world: Any, queries: list, plans: dict[int, Any], modes: tuple[str, ...], raw: bool = False):
    """Per-query records and the metrics of each mode (missing plans count as undelivered). `raw` scores each plan
    exactly as written; else plans are normalised first (official keys, cost suffixes stripped)."""
    from tqdm import tqdm

    from components.travel.evaluate import evaluate_plan
    from components.travel.metrics import summarize
    from components.travel.plans import parse_plan

    records, by_mode = [], {mode: {} for mode in modes}
    for query in tqdm(queries, desc="evaluate", unit="plan", disable=len(queries) < 50):
        written = plans.get(query.idx)
        plan, error = parse_plan(written, normalize=not raw, raw=raw) if written else (None, "no plan delivered")
        record: dict[str, Any] = {"idx": query.idx, "level": query.level, "days": query.days,
                                  "plan_error": error, "evaluation": {}}
        for mode in modes:
            evaluation = evaluate_plan(world, query, plan if plan is not None else written, mode)
            by_mode[mode][query.idx] = evaluation
            record["evaluation"][mode] = evaluation.to_dict()
        records.append(record)
    metrics: dict[str, Any] = {"n": len(queries)}
    for mode in modes:
        metrics[mode] = summarize(queries, by_mode[mode])
    return records, metrics


def format_table(metrics: dict[str, Any]) -> str:
    """The six metrics (in percent) with one column per mode, then per-check pass rates."""
    modes = [m for m in ("official", "strict") if m in metrics]
    width = max(len(label) for _, label in METRIC_LABELS) + 2
    lines = [f"{'N = ' + str(metrics['n']):<{width}}" + "".join(f"{m:>10}" for m in modes)]
    for key, label in METRIC_LABELS:
        lines.append(f"{label:<{width}}" + "".join(f"{100 * metrics[m][key]:>9.1f}%" for m in modes))
    checks = list(metrics[modes[0]]["per_check"]) if modes else []
    if checks:
        lines.append("per check:")
        check_width = max(len(c) for c in checks) + 4
        for check in checks:
            lines.append(f"  {check:<{check_width - 2}}" +
                         "".join(f"{100 * metrics[m]['per_check'].get(check, 0.0):>9.1f}%" for m in modes))
    return "\n".join(lines)


def run_evaluate(args: argparse.Namespace) -> int:
    from components.travel.tasks import load_any
    from components.travel.world import World

    world = World.load(args.world)
    queries = load_any(args.queries)
    plans = read_plans(args.plans)
    unknown = sorted(set(plans) - {q.idx for q in queries})
    if unknown:
        raise UserError(f"{args.plans} has plans for idx {unknown[:10]} that are not in {args.queries}; "
                        "plans are matched to queries by idx")
    modes = ("official", "strict") if args.mode == "both" else (args.mode,)
    records, metrics = evaluate_file(world, queries, plans, modes, raw=args.raw)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(metrics, indent=2) + "\n")
    per_plan = out.with_name(out.stem + ".plans.jsonl")
    with per_plan.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    print(format_table(metrics))
    print(f"wrote {out} and {per_plan}")
    return 0
