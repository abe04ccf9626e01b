"""The `star` command: one sub-command per pipeline stage (what dvc.yaml runs) plus user tools.

Each stage package contributes its sub-commands through its one `commands` module with a `register(subparsers)`
function; heavy libraries (torch, transformers, mlflow, prefect) are imported inside the handlers so that
`star --help` and the sandbox tools start instantly.
"""
from __future__ import annotations

import argparse
import errno
import importlib
import sys

from components import lifeline
from components.errors import UserError

COMMAND_MODULES = [
    "components.orchestration.commands",
    "flows.commands",
    "components.travel.commands",
    "components.synthesis.commands",
    "components.evaluation.commands",
    "components.models.commands",
    "components.training.commands",
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
    args.argv = [str(arg) for arg in (sys.argv[1:] if argv is None else argv)]  # to start it again (a launcher)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        with lifeline.held(args.command):  # SIGTERM stops like Ctrl-C; a stage stops when its dvc process is gone
            return int(args.handler(args) or 0)
    except KeyboardInterrupt as exc:
        print("interrupted", file=sys.stderr)
        return getattr(exc, "exit_code", 130)  # 143 after SIGTERM (lifeline.Terminated)
    except UserError as exc:  # bad input, params or environment: exit 1 (2 is argparse's usage error)
        print(f"star {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        message = storage_error(exc, getattr(args, "out", None))
        if message is None:
            raise
        print(f"star {args.command}: error: {message}", file=sys.stderr)
        return 1


# errno -> what to do about it, for the storage failures a stage can hit while writing its outputs
STORAGE_ERRORS = {
    errno.ENOSPC: "free some space (or point the output elsewhere) and rerun",
    errno.EDQUOT: "free some of your quota (or point the output elsewhere) and rerun",
    errno.EACCES: "make it writable for this user, or choose another output path",
    errno.EPERM: "make it writable for this user, or choose another output path",
    errno.EROFS: "the file system is read-only: choose another output path",
}


def storage_error(exc: OSError, out: object = None) -> str | None:
    """One line for a disk-full or unwritable-path error, naming the file (or else the command's `--out`); None for
    other OS errors, which keep their traceback."""
    advice = STORAGE_ERRORS.get(exc.errno)
    if advice is None:
        return None
    target = exc.filename or out
    where = f" {target}" if target else ""
    return f"cannot write{where}: {exc.strerror or exc}; {advice}"


if __name__ == "__main__":
    sys.exit(main())
