"""`star sft`: fine-tune a checkpoint on the SFT records (assistant-only loss) and save a Hugging Face checkpoint;
`star rl`: reinforcement learning (GRPO / Dr.GRPO / DAPO / ARPO / AEPO) from the SFT checkpoint in the environment
of `rl.env.kind` (components/environments.py: travel, the default; toolstar; qa).

One code path for every branch: `--section` names the params section (and with it the MLflow stage run and the
registered model), so the Tool-Star branch's stages are `star sft --params params/toolstar_sft.yaml --section
toolstar_sft` and `star rl --params params/toolstar_rl.yaml --section toolstar_rl` (stage runs `toolstar_sft` and
`toolstar_rl`, registered models `star-toolstar-sft` and `star-toolstar-rl`). Heavy libraries (torch,
transformers, mlflow) are imported inside the handlers, so that `star --help` stays fast.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from components.params import load_section
from components.training.rl.params import RLParams
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
    register_rl(subparsers)


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


def register_rl(subparsers: argparse._SubParsersAction) -> None:
    """Add `star rl` to the CLI."""
    parser = subparsers.add_parser(
        "rl", help="RL with multi-turn rollouts and the STAR rewards, or on Tool-Star tasks (resumable)",
        description="RL with multi-turn rollouts (resumable). rl.env.kind in --params picks the environment: travel "
                    "(the default: --world and --queries, the strict evaluator and the STAR reward kinds) or "
                    "toolstar (--queries is a Tool-Star task file such as data/toolstar/sft.jsonl, --qa the folder "
                    "of the search tool's corpus.jsonl, --toolstar-params the retriever, sandbox, tool-call limit "
                    "and answer metric; Tool-Star's reward: -1 format error, the answer's score, +0.1 for both "
                    "tools).")
    parser.add_argument("--params", default="params/rl.yaml", type=Path)
    parser.add_argument("--section", default="rl",
                        help="the params section to read, also the MLflow stage name and the registered model "
                             "(toolstar_rl: the Tool-Star branch, params/toolstar_rl.yaml)")
    parser.add_argument("--model", default="models/sft", type=Path, help="checkpoint to start from (the SFT model)")
    parser.add_argument("--world", default="data/world", type=Path, help="the travel world (rl.env.kind travel)")
    parser.add_argument("--queries", default="data/queries/rl.jsonl", type=Path,
                        help="the records RL draws: travel queries, or Tool-Star tasks with rl.env.kind toolstar "
                             "(e.g. data/toolstar/sft.jsonl)")
    parser.add_argument("--qa", default="data/qa", type=Path,
                        help="rl.env.kind toolstar: the QA stage's folder, whose corpus.jsonl the search tool reads")
    parser.add_argument("--toolstar-params", default="params/toolstar.yaml", type=Path,
                        help="rl.env.kind toolstar: the `toolstar` section (retriever, sandbox, max_tool_calls, "
                             "reward_metric)")
    parser.add_argument("--eval-queries", default="data/queries/val.jsonl", type=Path,
                        help="held-out records decoded greedily during training when rl.eval.every is set (travel "
                             "queries, or Tool-Star tasks with rl.env.kind toolstar, e.g. data/toolstar/val.jsonl)")
    parser.add_argument("--out", default="models/rl", type=Path, help="where the final Hugging Face checkpoint goes")
    parser.add_argument("--checkpoints", default="checkpoints/rl", type=Path,
                        help="resumable checkpoints (a persist: true DVC output); a run resumes from the newest")
    parser.add_argument("--metrics", default="metrics/rl.json", type=Path)
    parser.add_argument("--plots", default="plots/rl", type=Path,
                        help="folder of rewards.csv (one row per step) and eval.csv (one row per greedy evaluation)")
    parser.add_argument("--no-register", action="store_true", help="log the model without registering a version")
    parser.add_argument("--plan", action="store_true",
                        help="print what the params need on each GPU (weights, gradients, optimiser, activations, KV "
                             "cache) and the tokens per step, from the model's shape alone, then exit")
    parser.add_argument("--gpu-memory-gib", type=float, default=80.0,
                        help="with --plan: the GPU memory to check the plan against (default 80, an H100)")
    parser.add_argument("--model-params", default="params/model.yaml", type=Path,
                        help="with --plan: the base_model stage's params, whose `source` gives the model's shape "
                             "while --model does not exist yet")
    parser.set_defaults(handler=rl)


def plan_text(params: RLParams, args: argparse.Namespace) -> str:
    """`star rl --plan`: the memory and token plan of `params` for the model at --model (or the base model of
    --model-params while --model does not exist yet)."""
    import yaml

    from components.training.rl.plan import find_architecture, make_plan, render

    base = None
    if args.model_params.is_file():
        base = ((yaml.safe_load(args.model_params.read_text()) or {}).get("model") or {}).get("source")
    architecture = find_architecture(args.model, base)
    return render(make_plan(params, architecture, vllm=params.rollout.backend != "hf"), args.gpu_memory_gib)


def rl(args: argparse.Namespace) -> int:
    """Run the rl stage inside one MLflow child run: every step's metrics, then the reward curve and the model. A run
    that resumes from a checkpoint is tagged with the run it continues (`star.resumed_from_run`)."""
    from components.training import launch

    params = load_section(args.params, args.section, RLParams)
    if args.plan:
        print(plan_text(params, args))
        return 0
    code = launch.relaunch(args, launch.rl_processes(params))  # strategy deepspeed: under torchrun
    if code is not None:  # this command ran again under torchrun: that run was the stage
        return code
    from components import tracking
    from components.training.rl.trainer import RLPaths, train

    paths = RLPaths(model=args.model, world=args.world, queries=args.queries, out=args.out,
                    checkpoints=args.checkpoints, metrics=args.metrics, plots=args.plots,
                    eval_queries=args.eval_queries, qa=args.qa, toolstar_params=args.toolstar_params)
    if not launch.is_main_process():  # a data-parallel replica: rank 0 tracks and writes the stage's outputs
        train(params, paths, progress_bar=False)
        return 0
    with tracking.stage_run(args.section, params=params, tags={"star.base_model": str(args.model),
                                                       "star.rl.algorithm": params.algorithm,
                                                       "star.rl.env": params.env.kind}) as run:
        for name, path, context in (("queries", paths.queries, "training"),
                                    ("eval_queries", paths.eval_queries, "evaluation")):
            if path is not None and Path(path).is_file():
                run.log_input(name, path, context=context)
        summary = train(params, paths, log=run.log_metrics, tag=run.set_tags, run_id=run.run_id)
        run.log_stats(summary)
        run.log_artifact(paths.metrics)
        run.log_artifact(paths.rewards_csv)
        if paths.eval_csv.exists():
            run.log_artifact(paths.eval_csv)
        run.log_model(paths.out, registered_name=None if args.no_register else registered_name(args.section))
    return 0
