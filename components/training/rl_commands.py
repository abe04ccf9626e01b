"""`star rl`: reinforcement learning (GRPO / Dr.GRPO / DAPO / ARPO / AEPO) from the SFT checkpoint, in the travel
sandbox (`rl.env.kind: travel`, the default) or on Tool-Star's tasks (`rl.env.kind: toolstar`).

One RL code path for every branch: `--section` names the params section (and with it the MLflow stage run and the
registered model), so the Tool-Star branch's stage is `star rl --params params/toolstar_rl.yaml --section
toolstar_rl` (stage run `toolstar_rl`, registered model `star-toolstar-rl`).
Heavy libraries (torch, transformers, mlflow) are imported inside the handler, so that `star --help` stays fast."""
from __future__ import annotations

import argparse
from pathlib import Path

from components.params import load_section
from components.training.commands import registered_name
from components.training.rl.params import RLParams


def register(subparsers: argparse._SubParsersAction) -> None:
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
                        help="held-out queries decoded greedily during training when rl.eval.every is set")
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
