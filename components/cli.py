"""The `star` command: one sub-command per pipeline stage (what dvc.yaml runs) plus user tools.

Each stage package contributes its sub-commands through a `commands` module with a `register(subparsers)`
function; heavy libraries (torch, transformers, mlflow, prefect) are imported inside the handlers so that
`star --help` and the sandbox tools start instantly.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from components import lifeline
from components.errors import UserError

COMMAND_MODULES = [
    "components.orchestration.commands",
    "components.travel.commands",
    "components.travel.eval_commands",
    "components.synthesis.commands",
    "components.evaluation.commands",
    "components.models.commands",
    "components.training.commands",
    "components.training.rl_commands",
    "components.tracking_commands",
]

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="star",
        description="STAR pipeline: synthesis -> SFT -> RL for tool-use agents on TravelPlanner.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        with lifeline.held(args.command):  # SIGTERM stops like Ctrl-C; a stage stops when its dvc process is gone
            return int(args.handler(args) or 0)
    except KeyboardInterrupt as exc:
        print("interrupted", file=sys.stderr)
        return getattr(exc, "exit_code", 130)  # 143 after SIGTERM (lifeline.Terminated)
    except UserError as exc:
        print(f"star {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
