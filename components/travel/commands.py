"""`star world …` (build, import, synth), `star tool` (call one sandbox tool from the shell), `star evaluate` and
`star queries` (the queries stage: travel's task generation, `queries.py`).

`star evaluate` scores a plans file against its queries in official and/or strict mode:

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


# Each handler imports its stage code (typed params, MLflow through components.tracking) when called, so that
# `star --help` stays instant.


def register(subparsers: argparse._SubParsersAction) -> None:
    world = subparsers.add_parser("world", help="materialise the sandbox database (synthetic or real)")
    world_sub = world.add_subparsers(dest="world_command", metavar="ACTION", required=True)

    build = world_sub.add_parser("build", help="the `world` stage: synthesise or import, as params/world.yaml says")
    build.add_argument("--params", default="params/world.yaml", help="params file with a `world:` section")
    build.add_argument("--out", default="data/world", help="output world directory")
    build.set_defaults(handler=build_handler)

    synth = world_sub.add_parser("synth", help="generate a synthetic world from params")
    synth.add_argument("--params", default="params/world.yaml", help="params file with a `world:` section")
    synth.add_argument("--out", required=True, help="output world directory")
    synth.set_defaults(handler=synth_handler)

    imp = world_sub.add_parser("import", help="import the real TravelPlanner database")
    imp.add_argument("--source", required=True, help="folder holding database/ (official or flat layout)")
    imp.add_argument("--out", required=True, help="output world directory")
    imp.add_argument("--flights-from-ref-info", default=None, metavar="FILE",
                     help="build flights from the flight rows of a train_ref_info.jsonl (when the CSV is absent)")
    imp.set_defaults(handler=import_handler)

    layout = world_sub.add_parser(
        "layout-reference", help="lay a reference copy of the benchmark (flat database/*.csv + fixtures/"
                                 "train_ref_info.jsonl) out as the official database, with a flights CSV made of "
                                 "the reference information's flight rows")
    layout.add_argument("--reference", required=True, help="folder holding database/ and fixtures/train_ref_info.jsonl")
    layout.add_argument("--out", default="data/travelplanner", help="the official layout's folder (a world.source)")
    layout.set_defaults(handler=layout_handler)

    tool = subparsers.add_parser("tool", help="call one sandbox tool, e.g. star tool --world data/world "
                                              "SearchCity '{\"state\": \"Texas\"}'")
    tool.add_argument("--world", default="data/world", help="world directory")
    tool.add_argument("name", help="tool name (SearchFlight, GoogleDistanceMatrix, SearchAccommodation, "
                                   "SearchRestaurant, SearchAttraction, SearchCity)")
    tool.add_argument("arguments", help="JSON object of arguments")
    tool.set_defaults(handler=tool_handler)
    register_evaluate(subparsers)
    register_queries(subparsers)


def _load_world_params(path: str):
    from components.params import load_section
    from components.travel.synthetic import WorldParams

    return load_section(path, "world", WorldParams)


def _report(manifest: dict, out: str) -> None:
    rows = ", ".join(f"{name} {info['rows']:,}" for name, info in manifest["tables"].items())
    print(f"wrote {out}: {rows}; prompt style {manifest.get('prompt_style', 'full')}")


def build_world(params, out: str) -> dict:
    """What the `world` stage does: synthesise when `source` is "synthetic", else import from that path."""
    if params.source == "synthetic":
        from components.travel.synthetic import write_synthetic_world

        return write_synthetic_world(params, out)
    from components.travel.importer import import_database, missing_database

    if not Path(params.source).exists():
        raise missing_database(params.source, f"world.source={params.source!r} is neither \"synthetic\" nor an "
                                              f"existing folder")
    return import_database(params.source, out, flights_from_ref_info=params.flights_from_ref_info,
                           prompt_style=params.prompt_style)


def build_handler(args: argparse.Namespace) -> int:
    from components import tracking  # MLflow only; the sandbox itself imports no ML library

    params = _load_world_params(args.params)
    with tracking.stage_run("world", params=params) as run:
        manifest = build_world(params, args.out)
        run.log_stats({f"rows.{name}": info["rows"] for name, info in manifest["tables"].items()})
        run.log_artifact(str(Path(args.out) / "manifest.json"))
    _report(manifest, args.out)
    return 0


def synth_handler(args: argparse.Namespace) -> int:
    from components.travel.synthetic import write_synthetic_world

    _report(write_synthetic_world(_load_world_params(args.params), args.out), args.out)
    return 0


def import_handler(args: argparse.Namespace) -> int:
    from components.travel.importer import import_database

    _report(import_database(args.source, args.out, flights_from_ref_info=args.flights_from_ref_info), args.out)
    return 0


def layout_handler(args: argparse.Namespace) -> int:
    from components.travel.importer import lay_out_reference

    out = lay_out_reference(args.reference, args.out)
    print(f"wrote {out}/database/ in the official layout (flights: the reference information's rows); "
          f"import it with `star world import --source {out} --out data/world`")
    return 0


def tool_handler(args: argparse.Namespace) -> int:
    from components.travel.tools import call_tool
    from components.travel.world import World

    try:
        arguments = json.loads(args.arguments)
    except json.JSONDecodeError as exc:
        raise UserError(f"arguments must be a JSON object, e.g. '{{\"city\": \"Dallas\"}}' ({exc.msg})") from None
    output = call_tool(World.load(args.world), args.name, arguments)
    print(output.text)
    return 0 if output.ok else 1


# The evaluator, the world tables and tqdm are imported where they are used, so that `star --help` stays instant.

METRIC_LABELS = (
    ("delivery_rate", "Delivery rate"),
    ("commonsense_micro", "Commonsense micro"),
    ("commonsense_macro", "Commonsense macro"),
    ("hard_micro", "Hard micro"),
    ("hard_macro", "Hard macro"),
    ("final_pass", "Final pass rate"),
)


def register_evaluate(subparsers: argparse._SubParsersAction) -> None:
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


# ---- the queries stage ---------------------------------------------------------------------------------------------

def register_queries(subparsers: argparse._SubParsersAction) -> None:
    queries = subparsers.add_parser("queries", help="synthesise feasible queries: data/queries/{sft,rl,val}.jsonl")
    queries.add_argument("--params", default="params/queries.yaml", type=Path, help="file with a `queries:` section")
    queries.add_argument("--world", default="data/world", type=Path, help="world directory")
    queries.add_argument("--out", default="data/queries", type=Path, help="folder for sft/rl/val.jsonl")
    queries.add_argument("--metrics", default="metrics/queries.json", type=Path, help="stage summary JSON")
    queries.set_defaults(handler=queries_handler)


def queries_handler(args: argparse.Namespace) -> int:
    """The queries stage: the SFT, RL and validation query sets of one world, and their summary."""
    from components import tracking
    from components.params import load_section
    from components.travel.queries import QueriesParams, synthesize_splits
    from components.travel.tasks import dump_queries, load_any
    from components.travel.world import World

    params = load_section(args.params, "queries", QueriesParams)
    world = World.load(args.world)
    val_queries = None
    if params.val_source:
        if not Path(params.val_source).exists():
            raise UserError(f"queries.val_source {params.val_source} does not exist; point it to the official "
                            "validation CSV/JSONL or set it to null to synthesise the validation set")
        val_queries = load_any(params.val_source)
    client = _text_client(params)
    with tracking.stage_run("queries", params=params) as run:
        try:
            splits, summary = synthesize_splits(world, params, text_client=client, val_queries=val_queries)
        finally:
            if client is not None:
                client.close()
        for name, queries in splits.items():
            dump_queries(queries, args.out / f"{name}.jsonl")
        args.metrics.parent.mkdir(parents=True, exist_ok=True)
        args.metrics.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
        run.log_stats(summary)
        run.log_artifact(args.metrics)
    sizes = ", ".join(f"{k} {v}" for k, v in summary["sizes"].items())
    print(f"wrote {args.out}/{{sft,rl,val}}.jsonl ({sizes}; {summary['attempts']} skeletons tried); "
          f"metrics in {args.metrics}")
    return 0


def _text_client(params):
    """The back-translation client of `text.mode: llm`; None for templates."""
    if params.text.mode != "llm":
        return None
    from components.agent.http import OpenAIChatClient

    return OpenAIChatClient(params.text.endpoint.config())
