"""`star teach`, `star filter`: the trajectories and sft_data stages (the queries stage, travel's task generation,
is `star queries` in components/travel/commands.py).

Each handler reads its typed params, opens one MLflow child run (`components.tracking.stage_run`), writes its
outputs and metrics JSON, and prints where they went. Heavy imports stay inside the handlers.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from components.errors import UserError


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the synthesis stages to the CLI."""
    teach = subparsers.add_parser("teach", help="roll the teacher out on queries (resumable JSONL of trajectories)")
    teach.add_argument("--params", default="params/teacher.yaml", type=Path, help="file with a `teacher:` section")
    teach.add_argument("--world", default="data/world", type=Path, help="world directory")
    teach.add_argument("--queries", default="data/queries/sft.jsonl", type=Path, help="query JSONL to solve")
    teach.add_argument("--out", default="data/trajectories/teacher.jsonl", type=Path,
                       help="trajectory JSONL (appended as episodes end; a rerun resumes it)")
    teach.add_argument("--metrics", default="metrics/teacher.json", type=Path, help="stage summary JSON")
    teach.add_argument("--fresh", action="store_true", help="discard an existing output instead of resuming it")
    teach.set_defaults(handler=teach_handler)

    filt = subparsers.add_parser("filter", help="filter trajectories into SFT records: data/sft/{train,eval}.jsonl")
    filt.add_argument("--params", default="params/filter.yaml", type=Path, help="file with a `filter:` section")
    filt.add_argument("--in", dest="inp", default="data/trajectories/teacher.jsonl", type=Path,
                      help="trajectory JSONL from `star teach`")
    filt.add_argument("--out", default="data/sft", type=Path, help="folder for train.jsonl and eval.jsonl")
    filt.add_argument("--metrics", default="metrics/filter.json", type=Path, help="stage summary JSON")
    filt.set_defaults(handler=filter_handler)


def write_json(data: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def teach_handler(args: argparse.Namespace) -> int:
    """The trajectories stage: the teacher on the queries of `--queries` over the world of `--world`."""
    from components import environments, tracking
    from components.agent.environment import SourceInputs
    from components.params import load_section
    from components.synthesis.teacher import TEACHER_ENV, TeacherParams, teach

    params = load_section(args.params, "teacher", TeacherParams)
    inputs = SourceInputs(tasks=args.queries, files={"world": args.world}, failure_rate=params.failure_rate,
                          full_evaluation=True)
    source = environments.load_source(TEACHER_ENV, inputs)
    if args.fresh:
        from components.synthesis.teacher import settings_path

        for path in (args.out, settings_path(args.out)):
            path.unlink(missing_ok=True)
    with tracking.stage_run("trajectories", params=params) as run:
        summary = teach(source, params, args.out)
        write_json(summary, args.metrics)
        run.log_stats(summary)
        run.log_artifact(args.metrics)
    print(f"wrote {summary['n']} trajectories to {args.out} ({summary['generated']} new, {summary['resumed']} "
          f"resumed; strict final pass {summary['strict_final_pass']:.1%}); metrics in {args.metrics}")
    return 0


def filter_handler(args: argparse.Namespace) -> int:
    """The sft_data stage."""
    from components import tracking
    from components.params import load_section
    from components.synthesis.filter import (FilterParams, filter_trajectories, load_counter, read_jsonl,
                                             split_train_eval, write_jsonl)

    params = load_section(args.params, "filter", FilterParams)
    if not args.inp.exists():
        raise UserError(f"{args.inp} does not exist; run `star teach` (the trajectories stage) first")
    records = read_jsonl(args.inp)
    count, counter_name = load_counter(params)
    with tracking.stage_run("sft_data", params=params) as run:
        kept, stats = filter_trajectories(records, params, count)
        train, evaluation = split_train_eval(kept, params.eval_fraction, params.seed)
        write_jsonl(train, args.out / "train.jsonl")
        write_jsonl(evaluation, args.out / "eval.jsonl")
        stats.update({"train": len(train), "eval": len(evaluation), "token_counter": counter_name})
        write_json(stats, args.metrics)
        run.log_stats(stats)
        run.log_artifact(args.metrics)
    if not kept:
        print("warning: no trajectory passed the filter; SFT will have no data", file=sys.stderr)
    print(f"kept {len(kept)} of {len(records)} trajectories: {len(train)} train, {len(evaluation)} eval in "
          f"{args.out}; metrics in {args.metrics}")
    return 0
