"""`star qa build`, `star validate`, `star rollout`, `star ood-qa`, `star report`: the evaluation stages.

    star qa build --params params/ood_qa.yaml --out data/qa
    star validate --params params/validate.yaml --model models/sft --name sft --world data/world \
        --queries data/queries/val.jsonl --out data/validate/sft.jsonl --metrics metrics/validate/sft.json
    star rollout --model models/sft --world data/world --queries data/queries/val.jsonl --out /tmp/t.jsonl
    star ood-qa --params params/ood_qa.yaml --model models/rl --name rl --qa data/qa --out metrics/ood_qa/rl.json
    star report --params params/report.yaml --metrics metrics --plots plots --out reports

`star toolstar tasks | teach | eval`: the Tool-Star branch's stages (dvc.yaml: toolstar_tasks, toolstar_sft_data,
toolstar_eval@{base,sft}; the toolstar_sft stage between them is `star sft --section toolstar_sft`).

    star toolstar tasks --params params/toolstar.yaml --qa data/qa --out data/toolstar
    star toolstar tasks --dataset gsm8k [--split test] [--limit 200] [--dataset-path DIR] \
        [--out data/toolstar/datasets]                  # an evaluation dataset's tasks: OUT/gsm8k.jsonl
    star toolstar teach --params params/toolstar.yaml --qa data/qa --tasks data/toolstar/sft.jsonl \
        --out data/toolstar/sft_records
    star toolstar eval --params params/toolstar.yaml --model models/toolstar_sft --name sft --qa data/qa \
        --tasks data/toolstar/val.jsonl --out metrics/toolstar/sft.json

Each handler reads the `toolstar:` section, opens its MLflow stage run (`components.tracking.stage_run`), writes its
outputs and a metrics JSON, and prints where they went. Stage code is imported inside the handlers, so that
`star --help` stays instant.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from components.errors import UserError


# Each handler imports its stage code (typed params, MLflow through components.tracking) when called, so that
# `star --help` stays instant. A handler that decodes a checkpoint reads its params first and prestarts the rollout
# engine where its decoding runs there (components/evaluation/policy.py), then imports MLflow and the model
# libraries while the engine loads.


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the evaluation sub-commands to `star`."""
    qa = subparsers.add_parser("qa", help="out-of-domain QA data (encyclopedia corpus and questions)")
    qa_sub = qa.add_subparsers(dest="qa_command", metavar="QA_COMMAND")
    build = qa_sub.add_parser("build", help="generate the QA corpus and question sets (checked with the QA expert)")
    build.add_argument("--params", default="params/ood_qa.yaml")
    build.add_argument("--out", default="data/qa", help="output directory")
    build.add_argument("--metrics", default="metrics/qa_data.json", help="summary metrics JSON to write")
    build.set_defaults(handler=run_qa_build)

    validate = subparsers.add_parser("validate", help="evaluate a checkpoint on the validation queries")
    _checkpoint_arguments(validate, "params/validate.yaml")
    validate.add_argument("--world", required=True, help="world directory")
    validate.add_argument("--queries", required=True, help="validation queries JSONL")
    validate.add_argument("--out", required=True, help="per-query records JSONL to write")
    validate.add_argument("--metrics", required=True, help="metrics JSON to write")
    validate.add_argument("--submission", help="also write a TravelPlanner leaderboard submission JSONL here")
    validate.set_defaults(handler=run_validate)

    rollout = subparsers.add_parser("rollout", help="quick in-loop evaluation: trajectories + strict/official metrics")
    rollout.add_argument("--model", required=True, help="checkpoint directory (Hugging Face format) or Hub name")
    rollout.add_argument("--world", required=True, help="world directory")
    rollout.add_argument("--queries", required=True, help="queries JSONL")
    rollout.add_argument("--out", required=True, help="trajectories JSONL to write")
    rollout.add_argument("--params", default="params/validate.yaml", help="limits and decoding (section validate)")
    rollout.add_argument("--max-queries", type=int, help="only the first N queries")
    rollout.add_argument("--metrics", help="also write the metrics JSON here")
    rollout.set_defaults(handler=run_rollout)

    ood = subparsers.add_parser("ood-qa", help="out-of-domain QA (EM/F1) of a checkpoint and its alignment tax")
    _checkpoint_arguments(ood, "params/ood_qa.yaml")
    ood.add_argument("--qa", default="data/qa", help="directory written by `star qa build`")
    ood.add_argument("--out", required=True, help="metrics JSON to write (metrics/ood_qa/<name>.json); the "
                     "per-question results go beside it (<name>.questions.jsonl)")
    ood.add_argument("--base-metrics", help="the base checkpoint's OOD metrics, whose per-question results beside it "
                     "the alignment tax is paired with (default: base.json beside --out)")
    ood.add_argument("--records", help="also write every QA trajectory to this JSONL")
    ood.set_defaults(handler=run_ood_qa)

    report = subparsers.add_parser("report", help="Markdown/HTML report and figures from every run's metrics")
    report.add_argument("--params", default="params/report.yaml")
    report.add_argument("--metrics", default="metrics", help="metrics directory")
    report.add_argument("--plots", default="plots", help="plots directory (plots/rl/rewards.csv)")
    report.add_argument("--out", default="reports", help="output directory")
    report.set_defaults(handler=run_report)
    register_toolstar(subparsers)


def _checkpoint_arguments(parser: argparse.ArgumentParser, default_params: str) -> None:
    parser.add_argument("--params", default=default_params)
    parser.add_argument("--model", required=True, help="checkpoint directory (Hugging Face format) or Hub name")
    parser.add_argument("--name", required=True, help="checkpoint name in metrics and tracking (base, sft, rl, ...)")


# --- helpers ----------------------------------------------------------------------------------------------------

def write_json(data: dict, path: str | Path) -> Path:
    """Write pretty JSON (parents created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return path


def _print_modes(metrics: dict) -> None:
    keys = ("delivery_rate", "commonsense_micro", "commonsense_macro", "hard_micro", "hard_macro", "final_pass")
    print(f"{'metric':<20}{'strict':>10}{'official':>10}")
    for key in keys:
        print(f"{key:<20}{metrics['strict'][key]:>10.3f}{metrics['official'][key]:>10.3f}")


# --- handlers ---------------------------------------------------------------------------------------------------

def run_qa_build(args: argparse.Namespace) -> int:
    from components import tracking
    from components.evaluation.ood_qa import ood
    from components.params import load_section

    qa = ood()
    params = load_section(args.params, "ood_qa", qa.OODQAParams)
    started = time.perf_counter()
    with tracking.stage_run("qa_data", params=params) as run:
        metrics = qa.build_qa_data(params, args.out)
        metrics["wall_time_s"] = time.perf_counter() - started
        write_json(metrics, args.metrics)
        run.log_stats(metrics)
        run.log_artifact(args.metrics)
    print(f"wrote QA data to {args.out}/ ({metrics['passages']} passages, "
          f"{sum(metrics['questions'].values())} questions) and metrics to {args.metrics}")
    return 0


def run_validate(args: argparse.Namespace) -> int:
    from components.evaluation.policy import prestart_checkpoint_engine
    from components.evaluation.validate import validate_checkpoint, validation, write_jsonl
    from components.params import load_section

    travel = validation()
    params = load_section(args.params, "validate", travel.ValidateParams)
    prestart_checkpoint_engine(args.model, params.decoding, params.limits.max_context_tokens)
    from components import tracking  # MLflow: imported while the engine starts

    started = time.perf_counter()
    with tracking.stage_run(f"validate@{args.name}", params=params,
                                 tags={"star.checkpoint": args.name}) as run:
        queries, records, metrics = validate_checkpoint(args.model, args.world, args.queries, params)
        metrics.update({"checkpoint": args.name, "model": str(args.model),
                        "wall_time_s": time.perf_counter() - started})
        write_jsonl(records, args.out)
        write_json(metrics, args.metrics)
        submission = args.submission or params.submission
        if submission:
            write_jsonl(travel.submission_lines(queries, records), submission)
        run.log_metrics(metrics)
        run.log_artifact(args.metrics)
    _print_modes(metrics)
    print(f"wrote {len(records)} records to {args.out}, metrics to {args.metrics}"
          + (f", submission to {submission}" if submission else ""))
    return 0


def run_rollout(args: argparse.Namespace) -> int:
    from components.evaluation.validate import validate_checkpoint, validation, write_jsonl
    from components.params import load_section

    params_class = validation().ValidateParams
    params = load_section(args.params, "validate", params_class) if Path(args.params).exists() else params_class()
    if args.max_queries:
        params = params.model_copy(update={"max_queries": args.max_queries})
    _, records, metrics = validate_checkpoint(args.model, args.world, args.queries, params)
    write_jsonl(records, args.out)
    if args.metrics:
        write_json(metrics, args.metrics)
    _print_modes(metrics)
    print(f"terminations: {metrics['termination']['counts']}; mean tool calls "
          f"{metrics['tool_calls']['mean_tool_calls']:.1f}")
    print(f"wrote {len(records)} trajectories to {args.out}")
    return 0


def run_ood_qa(args: argparse.Namespace) -> int:
    from components.evaluation.ood_qa import evaluate_checkpoint, ood
    from components.evaluation.policy import prestart_checkpoint_engine
    from components.evaluation.question_results import questions_path, read_question_results
    from components.evaluation.validate import write_jsonl
    from components.params import load_section

    params = load_section(args.params, "ood_qa", ood().OODQAParams)
    prestart_checkpoint_engine(args.model, params.decoding, params.limits.max_context_tokens)
    from components import tracking  # MLflow: imported while the engine starts

    base_path = Path(args.base_metrics) if args.base_metrics else Path(args.out).parent / "base.json"
    base = None if args.name == "base" else read_question_results(questions_path(base_path))
    if args.base_metrics and base is None:
        raise UserError(f"the base's per-question results {questions_path(base_path)} do not exist (run "
                        f"`star ood-qa --name base --out {base_path}` first)")
    started = time.perf_counter()
    with tracking.stage_run(f"ood_qa@{args.name}", params=params,
                                 tags={"star.checkpoint": args.name}) as run:
        records: list[dict] = []
        metrics, questions = evaluate_checkpoint(args.model, params, args.qa, base_questions=base,
                                                 records_out=records)
        metrics.update({"checkpoint": args.name, "model": str(args.model),
                        "wall_time_s": time.perf_counter() - started})
        write_json(metrics, args.out)
        write_jsonl(questions, questions_path(args.out))
        if args.records:
            write_jsonl(records, args.records)
        run.log_metrics(metrics)
        run.log_artifact(args.out)
        run.log_artifact(questions_path(args.out))
    base_questions = questions_path(base_path)
    print(f"{args.name} ({params.mode}): EM {metrics['em']:.3f} {_interval(metrics.get('em_ci95'))}, F1 "
          f"{metrics['f1']:.3f} {_interval(metrics.get('f1_ci95'))} over {metrics['n']} questions"
          f"{_tax_line(metrics, args.name, base_questions)}")
    print(f"wrote {args.out} and {questions_path(args.out)}")
    return 0


def _interval(bounds: list[float] | None) -> str:
    return f"[{bounds[0]:.3f}, {bounds[1]:.3f}]" if bounds else ""


def _tax_line(metrics: dict, name: str, base_questions: Path) -> str:
    if "alignment_tax_abs" in metrics:
        return (f"; alignment tax {metrics['alignment_tax_abs']:+.3f} EM {_interval(metrics['alignment_tax_ci95'])} "
                f"vs base, paired over {metrics['alignment_tax_n']} questions")
    return "" if name == "base" else f"; no alignment tax ({base_questions} not found)"


def run_report(args: argparse.Namespace) -> int:
    from components import tracking
    from components.evaluation.report import ReportParams, build_report
    from components.params import load_section

    params = load_section(args.params, "report", ReportParams)
    with tracking.stage_run("report", params=params) as run:
        written = build_report(args.metrics, args.plots, args.out, params)
        for path in [written["markdown"], written["html"], *written["figures"], *written["tables"]]:
            run.log_artifact(path)
    print(f"wrote {written['markdown']}, {written['html']} and {len(written['figures'])} figures to {args.out}/")
    return 0


DEFAULT_PARAMS = "params/toolstar.yaml"


def register_toolstar(subparsers: argparse._SubParsersAction) -> None:
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
    from components.evaluation.toolstar import toolstar
    from components.params import load_section

    return load_section(path, "toolstar", toolstar("params").ToolStarParams)


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
    from components.evaluation.toolstar import toolstar

    out = args.out or Path("data/toolstar")
    metrics_path = args.metrics or Path("metrics/toolstar_tasks.json")
    params = _params(args.params)
    with tracking.stage_run("toolstar_tasks", params=params) as run:
        metrics = toolstar("splits").build_tasks(params, args.qa, out)
        write_json(metrics, metrics_path)
        run.log_stats(metrics)
        run.log_artifact(metrics_path)
    print(f"wrote {out}/sft.jsonl ({metrics['sft']['n']} tasks) and {out}/val.jsonl "
          f"({metrics['val']['n']} tasks); metrics in {metrics_path}")
    return 0


def run_dataset_tasks(args: argparse.Namespace) -> int:
    """`star toolstar tasks --dataset NAME`: the dataset's tasks in OUT/<name>.jsonl (no MLflow run: a data import,
    not a pipeline stage)."""
    from components.evaluation.toolstar import toolstar

    datasets = toolstar("datasets")
    tasks, summary = datasets.dataset_tasks(args.dataset, split=args.split, limit=args.limit, path=args.dataset_path)
    path = (args.out or Path("data/toolstar/datasets")) / datasets.task_file_name(args.dataset, args.split)
    toolstar("tasks").write_tasks(path, tasks)
    if args.metrics:
        write_json(summary, args.metrics)
    skipped = f", {summary['skipped']} rows without a question or an answer skipped" if summary["skipped"] else ""
    print(f"wrote {path}: {summary['n']} {summary['kind']} tasks from {summary['dataset']} split {summary['split']} "
          f"({'the Hugging Face Hub' if summary['source'] == 'hub' else summary['source']}){skipped}")
    return 0


def run_teach(args: argparse.Namespace) -> int:
    """The toolstar_sft_data stage."""
    from components import tracking
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
        run.log_stats(metrics)
        run.log_artifact(args.metrics)
    if not metrics["kept"]:
        print("warning: the expert solved no task; the toolstar_sft stage will have no data", file=sys.stderr)
    print(f"expert: solved {metrics['solve_rate']:.1%} of {metrics['n']} tasks; {_rates(metrics)}")
    print(f"kept {metrics['kept']}: {metrics['train']} train, {metrics['eval']} eval in {args.out}; "
          f"metrics in {args.metrics}")
    return 0


def run_eval(args: argparse.Namespace) -> int:
    """The toolstar_eval@<name> stages."""
    from components.evaluation.policy import prestart_checkpoint_engine
    from components.evaluation.toolstar import evaluate_checkpoint
    from components.evaluation.validate import write_jsonl

    params = _params(args.params)
    prestart_checkpoint_engine(args.model, params.eval.decoding, params.eval.limits.max_context_tokens)
    from components import tracking  # MLflow: imported while the engine starts

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
