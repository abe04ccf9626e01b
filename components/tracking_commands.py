"""`star mlflow replay`: put into MLflow what runs logged while it was unreachable (their spool files).

`components.tracking` (MLflow) is imported inside the handler, so `star --help` stays instant.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from components.errors import UserError
from components.redact import redact_url


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `star mlflow …` to the CLI."""
    mlflow = subparsers.add_parser("mlflow", help="MLflow tools: replay what stages logged while it was unreachable")
    actions = mlflow.add_subparsers(dest="mlflow_command", metavar="ACTION", required=True)
    replay = actions.add_parser("replay", help="log spool files (.star/mlflow-spool/*.jsonl) into MLflow: into "
                                               "their run when it exists, else into a new run")
    replay.add_argument("spools", nargs="*", type=Path, metavar="SPOOL",
                        help="spool files (default: every one under .star/mlflow-spool/ not replayed yet)")
    replay.set_defaults(handler=replay_handler)


def replay_handler(args: argparse.Namespace) -> int:
    from components import tracking

    folder = tracking.display_path(tracking.spool_dir())
    spools = args.spools or tracking.pending_spools()
    if not spools:
        print(f"nothing to replay: no spool files in {folder}")
        return 0
    for spool in spools:
        if not spool.is_file() and spool.with_name(spool.name + ".replayed").is_file():
            continue  # replayed above, as the parent run of another spool
        if not spool.is_file():
            raise UserError(f"no spool file {spool}; the ones not replayed yet are in {folder} "
                            f"(`{tracking.REPLAY_COMMAND}` without arguments replays them all)")
        with tracking.limited_http_waits():
            try:
                run_id = tracking.replay(spool)
            except UserError:
                raise
            except Exception as exc:
                raise UserError(f"MLflow at {redact_url(tracking.tracking_uri())} did not take {spool} "
                                f"({tracking.describe_error(exc)}); the file is kept: run `{tracking.REPLAY_COMMAND}` "
                                f"again once MLflow is up") from None
        print(f"replayed {spool} into MLflow run {run_id}")
    return 0
