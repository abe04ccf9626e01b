"""A `star` stage stops when the dvc (or Prefect) process that started it is gone; SIGTERM stops `star` like Ctrl-C.

DVC runs a stage's `cmd` through a shell (dvc -> bash -c -> star, or dvc -> star when the shell execs it), and a
killed `dvc repro` does not take the stage with it: the orphan kept writing `models/sft` beside the rerun's. So a
`star` command whose launcher (its nearest ancestor that is not a shell or a command wrapper) is dvc or Prefect
watches that launcher from a daemon thread, by pid and start time (pids are reused), and once it is gone stops
the way SIGTERM does: `Terminated`, a KeyboardInterrupt, in the main thread, so `finally` blocks and MLflow's run
cleanup run. A `star` typed at a shell has no launcher and is left alone.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

LAUNCHERS = ("dvc", "prefect")
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "fish", "busybox"})
WRAPPERS = frozenset({"env", "nice", "ionice", "stdbuf", "taskset", "time", "timeout", "uv"})
POLL_SECONDS = 1.0
GRACE_SECONDS = 30.0  # after the stop signal, how long cleanup may take before the process exits regardless
PR_SET_PDEATHSIG = 1
PROC = Path("/proc")


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: stop like Ctrl-C (the same cleanup), but exit with SIGTERM's code."""

    exit_code = 128 + signal.SIGTERM


@dataclass(frozen=True)
class Process:
    """One process as /proc shows it; `start_time` (clock ticks after boot) and `pid` together name it."""

    pid: int
    ppid: int
    start_time: int
    state: str
    argv: tuple[str, ...]

    @property
    def name(self) -> str:
        return program_name(self.argv)


def parse_stat(text: str) -> tuple[str, int, int]:
    """(state, parent pid, start time) from a /proc/<pid>/stat line: fields 3, 4 and 22 of `proc(5)`. The
    command name (field 2) is in parentheses and may hold spaces and parentheses itself."""
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[1]), int(fields[19])


def program_name(argv: Sequence[str]) -> str:
    """The program a command line runs: `dvc` for `dvc repro`, `/venv/bin/python /venv/bin/dvc repro` and
    `python -m dvc repro`; `prefect.engine` for `python -m prefect.engine`."""
    if not argv:
        return ""
    name = os.path.basename(argv[0])
    if not re.fullmatch(r"python[0-9.]*", name):
        return name
    rest = list(argv[1:])
    while rest:
        arg = rest.pop(0)
        if arg == "-m" and rest:
            return rest[0]
        if arg.startswith("-m") and len(arg) > 2:
            return arg[2:]
        if arg == "-c":
            return name
        if arg in ("-W", "-X"):  # options that take a value
            rest = rest[1:]
        elif not arg.startswith("-"):
            return os.path.basename(arg)
    return name


def find_launcher(ancestors: Sequence[Process]) -> Process | None:
    """The dvc or Prefect process that started us (ancestors nearest first), looking through shells and command
    wrappers only; None for anything else (an interactive shell, a test runner, a terminal)."""
    for process in ancestors:
        if process.name in SHELLS or process.name in WRAPPERS:
            continue
        return process if process.name.split(".")[0] in LAUNCHERS else None
    return None


def read_process(pid: int) -> Process | None:
    """The process `pid` from /proc, or None when there is none (or no /proc: not Linux)."""
    try:
        state, ppid, start_time = parse_stat((PROC / str(pid) / "stat").read_text())
        argv = (PROC / str(pid) / "cmdline").read_bytes().decode(errors="replace").split("\0")
    except (OSError, ValueError, IndexError):
        return None
    return Process(pid, ppid, start_time, state, tuple(arg for arg in argv if arg))


def ancestors(pid: int, limit: int = 8) -> list[Process]:
    """The ancestors of `pid`, its parent first, at most `limit` of them."""
    chain: list[Process] = []
    process = read_process(pid)
    while process and process.ppid > 0 and len(chain) < limit:
        process = read_process(process.ppid)
        if process:
            chain.append(process)
    return chain


def is_alive(process: Process) -> bool:
    """Whether `process` still runs: same pid and start time (not a reused pid), and not a zombie."""
    now = read_process(process.pid)
    return now is not None and now.start_time == process.start_time and now.state not in ("Z", "X")


def gone_message(command: str, launcher: Process) -> str:
    """The one line a stage prints when its launcher is gone."""
    return (f"star {command}: the {launcher.name.split('.')[0]} process that started this stage "
            f"(pid {launcher.pid}) is gone: stopping")


def _set_parent_death_signal(sig: int) -> None:
    """Linux: have the kernel send `sig` to us when our parent dies (0 clears it); elsewhere nothing."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)


class _Lifeline:
    """The state of one `held` command: its launcher, whether it is stopping, and the watchdog's stop flag."""

    def __init__(self, command: str, launcher: Process | None):
        self.command, self.launcher = command, launcher
        self.stopping = False
        self.done = threading.Event()
        self._announced = threading.Lock()

    def announce_gone(self) -> None:
        """Say once why the command stops: its launcher is gone."""
        if self.launcher is not None and self._announced.acquire(blocking=False):
            print(gone_message(self.command, self.launcher), file=sys.stderr, flush=True)

    def on_sigterm(self, signum: int, frame: object) -> None:
        """The first SIGTERM stops the command like Ctrl-C; later ones (the watchdog's, a parent-death signal)
        must not interrupt the cleanup it started."""
        if self.stopping:
            return
        self.stopping = True
        if self.launcher is not None and not is_alive(self.launcher):
            self.announce_gone()
        raise Terminated

    def watch(self, poll_seconds: float, grace_seconds: float) -> None:
        """Until the command ends: once the launcher is gone, SIGTERM the main thread; exit if cleanup hangs."""
        assert self.launcher is not None
        while not self.done.wait(poll_seconds):
            if is_alive(self.launcher):
                continue
            self.announce_gone()
            signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)
            if not self.done.wait(grace_seconds):
                print(f"star {self.command}: did not stop within {grace_seconds:.0f} s: exiting", file=sys.stderr,
                      flush=True)
                os._exit(Terminated.exit_code)
            return


@contextlib.contextmanager
def held(command: str, poll_seconds: float = POLL_SECONDS, grace_seconds: float = GRACE_SECONDS) -> Iterator[None]:
    """While `star <command>` runs: SIGTERM raises `Terminated` (a KeyboardInterrupt), and a command started by dvc
    or Prefect stops once that launcher is gone. Nothing changes outside the main thread (signals are its alone)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    lifeline = _Lifeline(command, find_launcher(ancestors(os.getpid())))
    previous = signal.signal(signal.SIGTERM, lifeline.on_sigterm) or signal.SIG_DFL  # None: set outside Python
    if lifeline.launcher is not None:
        _set_parent_death_signal(signal.SIGTERM)  # instant when the launcher is our parent (the shell exec'd us)
        threading.Thread(target=lifeline.watch, args=(poll_seconds, grace_seconds), name="star-lifeline",
                         daemon=True).start()
    try:
        yield
    finally:
        lifeline.done.set()
        if lifeline.launcher is not None:
            _set_parent_death_signal(0)
        signal.signal(signal.SIGTERM, previous)
