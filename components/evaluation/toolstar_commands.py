"""`star toolstar tasks | teach | eval`: the Tool-Star branch's stages (dvc.yaml: toolstar_tasks, toolstar_sft_data,
toolstar_eval@{base,sft}; the toolstar_sft stage between them is `star sft --section toolstar_sft`).

    star toolstar tasks --params params/toolstar.yaml --qa data/qa --out data/toolstar
    star toolstar tasks --dataset gsm8k [--split test] [--limit 200] [--dataset-path DIR] \\
        [--out data/toolstar/datasets]                  # an evaluation dataset's tasks: OUT/gsm8k.jsonl
    star toolstar teach --params params/toolstar.yaml --qa data/qa --tasks data/toolstar/sft.jsonl \\
        --out data/toolstar/sft_records
    star toolstar eval --params params/toolstar.yaml --model models/toolstar_sft --name sft --qa data/qa \\
        --tasks data/toolstar/val.jsonl --out metrics/toolstar/sft.json

Each handler reads the `toolstar:` section, opens its MLflow stage run (`components.tracking.stage_run`), writes its
outputs and a metrics JSON, and prints where they went. Stage code is imported inside the handlers, so that
`star --help` stays instant.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

DEFAULT_PARAMS = "params/toolstar.yaml"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `star toolstar` and its sub-commands."""
    toolstar = subparsers.add_parser("toolstar", help="the Tool-Star branch: search + python tasks, SFT data, eval")
    sub = toolstar.add_subparsers(dest="toolstar_command", metavar="TOOLSTAR_COMMAND")

    tasks = sub.add_parser("tasks", help="draw the SFT and validation task sets (disjoint) from the QA corpus, "
                                         "or (--dataset) read an evaluation dataset's tasks")
    tasks.add_argument("--params", default=DEFAULT_PARAMS, help="file with a `toolstar:` section")
    tasks.add_argument("--qa", default="data/qa", type=Path, help="directory written by `star qa build`")
    tasks.add_argument("--out", type=Path, help="folder for sft.jsonl and val.jsonl (default data/toolstar); with "
                                                "--dataset, for <name>.jsonl (default data/toolstar/datasets)")
    tasks.add_argument("--metrics", type=Path, help="stage summary JSON (default metrics/toolstar_tasks.json; "
                                                    "with --dataset, none unless given)")
    data = tasks.add_argument_group("evaluation datasets (components/toolstar/datasets.py)")
    data.add_argument("--dataset", help="gsm8k | math500 | hotpotqa | 2wikimultihopqa | musique | bamboogle: its "
                                        "tasks (kind math or qa) from the Hugging Face Hub or --dataset-path")
    data.add_argument("--split", help="the split to read (default: the one Tool-Star evaluates on)")
    data.add_argument("--limit", type=int, help="only the first N rows")
    data.add_argument("--dataset-path", type=Path,
                      help="a local copy instead of the Hub: a save_to_disk folder, a clone of the dataset "
                           "repository, or a .json/.jsonl/.parquet/.csv file with the Hub's columns")
    tasks.set_defaults(handler=run_tasks)

    teach = sub.add_parser("teach", help="the expert's solved episodes as SFT records: OUT/{train,eval}.jsonl")
    teach.add_argument("--params", default=DEFAULT_PARAMS, help="file with a `toolstar:` section")
    teach.add_argument("--qa", default="data/qa", type=Path, help="directory written by `star qa build`")
    teach.add_argument("--tasks", default="data/toolstar/sft.jsonl", type=Path, help="task JSONL to solve")
    teach.add_argument("--out", default="data/toolstar/sft_records", type=Path,
                       help="folder for train.jsonl and eval.jsonl (what `star sft --data` reads)")
    teach.add_argument("--metrics", default="metrics/toolstar_sft_data.json", type=Path, help="stage summary JSON")
    teach.set_defaults(handler=run_teach)

    evaluate = sub.add_parser("eval", help="a checkpoint's episodes on the held-out tasks: accuracy, reward, tools")
    evaluate.add_argument("--params", default=DEFAULT_PARAMS, help="file with a `toolstar:` section")
    evaluate.add_argument("--model", required=True, help="checkpoint directory (Hugging Face format) or Hub name")
    evaluate.add_argument("--name", required=True, help="checkpoint name in metrics and tracking (base, sft, ...)")
    evaluate.add_argument("--qa", default="data/qa", type=Path, help="directory written by `star qa build`")
    evaluate.add_argument("--tasks", default="data/toolstar/val.jsonl", type=Path, help="task JSONL to answer")
    evaluate.add_argument("--out", required=True, type=Path,
                          help="metrics JSON to write (metrics/toolstar/<name>.json)")
    evaluate.add_argument("--records", type=Path, help="also write every episode's trajectory record to this JSONL")
    evaluate.set_defaults(handler=run_eval)


def _params(path: str):
    from components.toolstar.params import ToolStarParams
    from components.params import load_section

    return load_section(path, "toolstar", ToolStarParams)


def _rates(metrics: dict) -> str:
    calls = metrics["tool_calls"]
    return (f"accuracy {metrics['accuracy']:.1%}, mean reward {metrics['mean_reward']:.3f}, tool calls per episode "
            f"{calls['total']:.2f} (search {calls['search']:.2f}, python {calls['python']:.2f})")


def run_tasks(args: argparse.Namespace) -> int:
    """The toolstar_tasks stage, or (--dataset) an evaluation dataset's tasks."""
    from components.errors import UserError

    if args.dataset is not None:
        return run_dataset_tasks(args)
    given = [flag for flag, value in (("--split", args.split), ("--limit", args.limit),
                                      ("--dataset-path", args.dataset_path)) if value is not None]
    if given:
        raise UserError(f"{', '.join(given)}: only with --dataset NAME")
    from components import tracking
    from components.evaluation.commands import write_json
    from components.evaluation.toolstar import build_tasks

    out = args.out or Path("data/toolstar")
    metrics_path = args.metrics or Path("metrics/toolstar_tasks.json")
    params = _params(args.params)
    with tracking.stage_run("toolstar_tasks", params=params) as run:
        metrics = build_tasks(params, args.qa, out)
        write_json(metrics, metrics_path)
        run.log_metrics(metrics)
        run.log_artifact(metrics_path)
    print(f"wrote {out}/sft.jsonl ({metrics['sft']['n']} tasks) and {out}/val.jsonl "
          f"({metrics['val']['n']} tasks); metrics in {metrics_path}")
    return 0


def run_dataset_tasks(args: argparse.Namespace) -> int:
    """`star toolstar tasks --dataset NAME`: the dataset's tasks in OUT/<name>.jsonl (no MLflow run: a data import,
    not a pipeline stage)."""
    from components.evaluation.commands import write_json
    from components.toolstar.datasets import dataset_tasks, task_file_name
    from components.toolstar.tasks import write_tasks

    tasks, summary = dataset_tasks(args.dataset, split=args.split, limit=args.limit, path=args.dataset_path)
    path = (args.out or Path("data/toolstar/datasets")) / task_file_name(args.dataset, args.split)
    write_tasks(path, tasks)
    if args.metrics:
        write_json(summary, args.metrics)
    skipped = f", {summary['skipped']} rows without a question or an answer skipped" if summary["skipped"] else ""
    print(f"wrote {path}: {summary['n']} {summary['kind']} tasks from {summary['dataset']} split {summary['split']} "
          f"({'the Hugging Face Hub' if summary['source'] == 'hub' else summary['source']}){skipped}")
    return 0


def run_teach(args: argparse.Namespace) -> int:
    """The toolstar_sft_data stage."""
    from components import tracking
    from components.evaluation.commands import write_json
    from components.evaluation.toolstar import teach
    from components.evaluation.validate import write_jsonl

    params = _params(args.params)
    started = time.perf_counter()
    with tracking.stage_run("toolstar_sft_data", params=params) as run:
        train, evaluation, metrics = teach(params, args.qa, args.tasks)
        metrics["wall_time_s"] = time.perf_counter() - started
        write_jsonl(train, args.out / "train.jsonl")
        write_jsonl(evaluation, args.out / "eval.jsonl")
        write_json(metrics, args.metrics)
        run.log_metrics(metrics)
        run.log_artifact(args.metrics)
    if not metrics["kept"]:
        print("warning: the expert solved no task; the toolstar_sft stage will have no data", file=sys.stderr)
    print(f"expert: solved {metrics['solve_rate']:.1%} of {metrics['n']} tasks; {_rates(metrics)}")
    print(f"kept {metrics['kept']}: {metrics['train']} train, {metrics['eval']} eval in {args.out}; "
          f"metrics in {args.metrics}")
    return 0


def run_eval(args: argparse.Namespace) -> int:
    """The toolstar_eval@<name> stages."""
    from components import tracking
    from components.evaluation.commands import write_json
    from components.evaluation.toolstar import evaluate_checkpoint
    from components.evaluation.validate import write_jsonl

    params = _params(args.params)
    started = time.perf_counter()
    with tracking.stage_run(f"toolstar_eval@{args.name}", params=params,
                            tags={"star.checkpoint": args.name}) as run:
        records: list[dict] = []
        metrics = evaluate_checkpoint(args.model, params, args.qa, args.tasks, records_out=records)
        metrics.update({"checkpoint": args.name, "model": str(args.model),
                        "wall_time_s": time.perf_counter() - started})
        write_json(metrics, args.out)
        if args.records:
            write_jsonl(records, args.records)
        run.log_metrics(metrics)
        run.log_artifact(args.out)
    print(f"{args.name}: {_rates(metrics)}; code errors {metrics['code_errors']}, sandbox kills "
          f"{metrics['sandbox_kills']}, format errors {metrics['format_errors']} over {metrics['n']} tasks")
    print(f"wrote {args.out}" + (f" and {args.records}" if args.records else ""))
    return 0
