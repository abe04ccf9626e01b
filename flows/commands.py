"""`star run`, `star sweep`, `star deploy`: the pipeline as Prefect flows.

Prefect (and through the flows, MLflow) is imported inside the handlers, so `star --help` stays instant.
"""
from __future__ import annotations

import argparse
import os

from components.errors import UserError
from components.orchestration.commands import project_root


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the flow sub-commands to `star`."""
    run = subparsers.add_parser("run", help="run the DVC pipeline as a Prefect flow (one task per stage)")
    run.add_argument("--preset", help="apply this preset to params/ first")
    run.add_argument("--stages", nargs="+", metavar="STAGE", help="only these stages (and their upstream)")
    run.add_argument("--experiment", help="MLflow experiment name (default: star-<preset>)")
    run.add_argument("--retries", type=int, default=1, help="retries of a stage after a transient failure")
    run.add_argument("--force", action="store_true", help="re-run stages even when DVC finds them up to date")
    run.set_defaults(handler=run_pipeline)

    sweep = subparsers.add_parser("sweep", help="run ablation variants as DVC experiments under one MLflow run")
    sweep.add_argument("--variant", action="append", required=True, metavar="NAME=FILE:KEY=VALUE[,FILE:KEY=VALUE]",
                       help="e.g. macro=params/rl.yaml:rl.reward.kind=macro (repeat per variant)")
    sweep.add_argument("--experiment", help="MLflow experiment name")
    sweep.add_argument("--in-workspace", action="store_true", help="run in the workspace instead of a temp copy")
    sweep.set_defaults(handler=run_sweep)

    deploy = subparsers.add_parser("deploy", help="register the scheduled pipeline deployment with Prefect")
    deploy.add_argument("--name", default="nightly")
    deploy.add_argument("--cron", default="0 2 * * *", help="cron schedule (default: nightly at 02:00)")
    deploy.add_argument("--timezone", default="UTC")
    deploy.add_argument("--work-pool", default="star", help="process work pool (created if absent)")
    deploy.add_argument("--preset")
    deploy.add_argument("--stages", nargs="+", metavar="STAGE")
    deploy.add_argument("--experiment")
    deploy.add_argument("--serve", action="store_true", help="serve the schedule from this process instead")
    deploy.set_defaults(handler=deploy_pipeline)


# Prefect waits 20 s for its temporary (ephemeral) API server, whose first start migrates a fresh database: on a
# loaded 2-core laptop that took longer, and `star run` died with "Timed out while attempting to connect to ephemeral
# Prefect API server". Read when prefect is imported, so it is set before the flows are.
EPHEMERAL_STARTUP_TIMEOUT_S = "180"


def _patient_ephemeral_server() -> None:
    """Give Prefect's temporary API server time to start, unless the user set the timeout or a server URL."""
    if not os.environ.get("PREFECT_API_URL"):
        os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", EPHEMERAL_STARTUP_TIMEOUT_S)


def run_pipeline(args: argparse.Namespace) -> int:
    """Run the pipeline flow and print each stage's status."""
    root = project_root()
    _patient_ephemeral_server()
    from flows.pipeline import pipeline

    statuses = pipeline(stages=args.stages, preset=args.preset, experiment=args.experiment,
                        root=str(root), retries=args.retries, force=args.force)
    for stage, status in statuses.items():
        print(f"{stage:<16} {status}")
    return 0


def parse_variants(specs: list[str]) -> dict[str, list[str]]:
    """`name=file:key=value[,file:key=value]` specs as {name: [overrides]}."""
    variants: dict[str, list[str]] = {}
    for spec in specs:
        name, sep, overrides = spec.partition("=")
        if not sep or not name or ":" not in overrides or "=" not in overrides:
            raise UserError(f"bad --variant '{spec}': expected NAME=FILE:KEY=VALUE, "
                            "e.g. macro=params/rl.yaml:rl.reward.kind=macro")
        variants[name] = overrides.split(",")
    return variants


def run_sweep(args: argparse.Namespace) -> int:
    """Run the sweep flow and print each variant's DVC experiment."""
    variants, root = parse_variants(args.variant), project_root()
    _patient_ephemeral_server()
    from flows.sweep import sweep

    results = sweep(variants, root=str(root), experiment=args.experiment, temp=not args.in_workspace)
    for variant, exp_name in results.items():
        print(f"{variant:<16} dvc experiment {exp_name}")
    print("compare: dvc exp show; dvc metrics diff; dvc plots diff")
    return 0


def deploy_pipeline(args: argparse.Namespace) -> int:
    """Register (or serve) the scheduled pipeline deployment."""
    root = project_root()
    from flows import deploy

    if args.serve:
        deploy.serve(root, args.name, args.cron, args.preset, args.stages, args.experiment)
        return 0
    if not os.environ.get("PREFECT_API_URL"):
        raise UserError("scheduling needs a Prefect server: start one (`prefect server start`, or `star ui --start`)"
                        " and set PREFECT_API_URL=http://127.0.0.1:4200/api, or use `star deploy --serve`")
    deployment_id = deploy.register(root, args.name, args.cron, args.work_pool, args.preset, args.stages,
                                    args.experiment, args.timezone)
    print(f"deployment star-pipeline/{args.name} ({deployment_id}) scheduled '{args.cron}' ({args.timezone}) "
          f"on work pool '{args.work_pool}'")
    print(f"start a worker to run it: prefect worker start --pool {args.work_pool}")
    return 0
