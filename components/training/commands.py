"""`star sft`: fine-tune a checkpoint on the SFT records (assistant-only loss) and save a Hugging Face checkpoint.
Heavy libraries (torch, transformers, mlflow) are imported inside the handler, so that `star --help` stays fast.

One SFT code path for every branch: `--section` names the params section (and with it the MLflow stage run and the
registered model), so the Tool-Star branch's stage is `star sft --params params/toolstar_sft.yaml --section
toolstar_sft` (stage run `toolstar_sft`, registered model `star-toolstar-sft`)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from components.params import load_section
from components.training.sft_params import SFTParams


def registered_name(section: str) -> str:
    """The model registry name of a training stage: `star-sft` for the `sft` section, `star-toolstar-sft` for
    `toolstar_sft`, `star-rl` and `star-toolstar-rl` likewise."""
    return "star-" + section.replace("_", "-")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `star sft` to the CLI."""
    parser = subparsers.add_parser("sft", help="supervised fine-tuning on the filtered teacher trajectories")
    parser.add_argument("--params", default="params/sft.yaml", type=Path)
    parser.add_argument("--section", default="sft",
                        help="the params section to read, also the MLflow stage name (toolstar_sft: the Tool-Star "
                             "branch, params/toolstar_sft.yaml)")
    parser.add_argument("--model", default="models/base", help="checkpoint directory (or Hub name) to start from")
    parser.add_argument("--data", default="data/sft", type=Path, help="folder with train.jsonl (and eval.jsonl)")
    parser.add_argument("--out", default="models/sft", type=Path)
    parser.add_argument("--metrics", default="metrics/sft.json", type=Path)
    parser.add_argument("--plots", default="plots/sft/loss.csv", type=Path)
    parser.set_defaults(handler=sft)


def sft(args: argparse.Namespace) -> int:
    """Run the sft stage: encode the records, train inside one MLflow child run, write checkpoint and metrics. The
    Trainer backend runs in a torchrun world of `processes` processes (components/training/launch.py)."""
    from components.training import launch

    params = load_section(args.params, args.section, SFTParams)
    code = launch.relaunch(args, launch.sft_processes(params, section=args.section))
    if code is not None:  # this command ran again under torchrun: that run was the stage
        return code
    from components import tracking
    from components.models.factory import count_parameters
    from components.models.loading import load_policy_model, load_tokenizer
    from components.training.sft import build_examples, load_records, write_loss_csv
    from components.training.sft_run import run_sft

    train_records = load_records(args.data / "train.jsonl")
    eval_path = args.data / "eval.jsonl"
    eval_records = (load_records(eval_path) if eval_path.exists() else [])[:params.eval_records]
    tokenizer = load_tokenizer(args.model)
    train, dropped_train = build_examples(tokenizer, train_records, params.cutoff_len, params.overlong,
                                          source=str(args.data / "train.jsonl"))
    evaluation, dropped_eval = build_examples(tokenizer, eval_records, params.cutoff_len, params.overlong,
                                              source=str(eval_path))
    # Master weights in float32: the Trainer's bf16 autocast / DeepSpeed's bf16 mode computes in 16 bits on GPU.
    model = load_policy_model(args.model, dtype="float32")
    if not launch.is_main_process():  # another rank of the Trainer's world: it trains; rank 0 tracks and writes
        run_sft(model, tokenizer, train, evaluation, params, args.out, progress=False)
        return 0
    with tracking.stage_run(args.section, params=params, tags={"star.base_model": str(args.model)}) as run:
        run.log_input("train", args.data / "train.jsonl")
        if eval_path.exists():
            run.log_input("eval", eval_path, context="evaluation")
        result = run_sft(model, tokenizer, train, evaluation, params, args.out, on_log=run.log_metrics,
                         manifest={"stage": args.section, "base": str(args.model),
                                   "parameters": count_parameters(model)})
        summary = {**result.summary, "train_records": len(train_records), "eval_records": len(eval_records),
                   "train_examples": len(train),
                   "eval_examples": len(evaluation),
                   "dropped_overlong_or_empty": dropped_train + dropped_eval,
                   "mean_tokens_per_example": round(sum(len(e) for e in train) / max(1, len(train)), 1)}
        args.metrics.parent.mkdir(parents=True, exist_ok=True)
        args.metrics.write_text(json.dumps(summary, indent=2) + "\n")
        write_loss_csv(result.history, args.plots)
        run.log_stats(summary)
        run.log_artifact(args.metrics)
        run.log_artifact(args.plots)
        run.log_model(args.out, registered_name=registered_name(args.section))
    print(f"{args.section}: train loss {summary['first_train_loss']:.3f} -> {summary['final_train_loss']:.3f}, "
          f"eval loss {summary['initial_eval_loss']} -> {summary['final_eval_loss']}, "
          f"{summary['tokens_per_second']:.0f} tokens/s, {summary['wall_seconds']:.0f} s", file=sys.stderr)
    print(f"SFT checkpoint in {args.out}; metrics in {args.metrics}; loss curve in {args.plots}")
    return 0
