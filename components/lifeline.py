"""A `star` stage stops when the dvc (or Prefect) process that started it is gone; SIGTERM stops `star` like Ctrl-C.

DVC runs a stage's `cmd` through a shell (dvc -> bash -c -> star, or dvc -> star when the shell execs it), and a
killed `dvc repro` does not take the stage with it: the orphan kept writing `models/sft` beside the rerun's. So a
`star` command whose launcher (its nearest ancestor that is not a shell or a command wrapper) is dvc or Prefect
watches that launcher from a daemon thread, by pid and start time (pids are reused), and once it is gone stops
the way SIGTERM does: `Terminated`, a KeyboardInterrupt, in the main thread, so `finally` blocks and MLflow's run
cleanup run. A `star` typed at a shell has no launcher and is left alone.

The other way round, a `star` command that starts long-lived children (`star run` its `dvc repro`, `star ui` its
servers) starts them with `tied`: each in a process group of its own behind a small guard (this file run as a
script) that the kernel signals when the `star` command dies, even by SIGKILL, and that then stops its whole group.
SIGTERM and Ctrl-C of the `star` command are forwarded to those groups. Linux only (prctl, /proc); elsewhere the
children still get the forwarded signals, but a SIGKILLed parent leaves them running.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

LAUNCHERS = ("dvc", "prefect")
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "fish", "busybox"})
WRAPPERS = frozenset({"env", "nice", "ionice", "stdbuf", "taskset", "time", "timeout", "uv"})
# a training stage that starts itself again under torchrun (components/training/launch.py): its processes look
# through the launcher and the `star` command that started it, to the dvc or Prefect process behind them
RELAUNCHERS = frozenset({"torch.distributed.run", "torchrun", "star"})
POLL_SECONDS = 1.0
GRACE_SECONDS = 30.0  # after the stop signal, how long cleanup may take before the process exits regardless
GROUP_GRACE_SECONDS = 20.0  # after SIGTERM, how long a tied child's group may take to stop before SIGKILL
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
    relaunched = False
    for process in ancestors:
        if process.name in SHELLS or process.name in WRAPPERS:
            continue
        if process.name in RELAUNCHERS and (relaunched or process.name != "star"):
            relaunched = True  # `star` is looked through only above its own torchrun
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


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group `pgid`, from /proc (empty without /proc)."""
    members = []
    for entry in PROC.iterdir() if PROC.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
            state, _, group = text[text.rindex(")") + 2:].split()[:3]
        except (OSError, ValueError):
            continue
        if int(group) == pgid and state not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def _set_parent_death_signal(sig: int) -> None:
    """Linux: have the kernel send `sig` to us when our parent dies (0 clears it); elsewhere nothing."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)


# ---------------------------------------------------------------- children that do not outlive us

_GROUPS: set[int] = set()  # the process groups `tied` started and that still run: where stop signals are forwarded
_GROUPS_LOCK = threading.RLock()  # re-entrant: a stop signal may arrive while this thread starts a child
_STOPPING = threading.Event()
_STOP_SIGNAL = [signal.SIGINT]  # the signal that set _STOPPING


class Stopping(RuntimeError):
    """A child was to start while this `star` command is stopping (SIGTERM or Ctrl-C)."""


def stopping() -> bool:
    """Whether this `star` command got SIGTERM or Ctrl-C: start nothing new, retry nothing."""
    return _STOPPING.is_set()


def raise_if_stopping() -> None:
    """Once this command is stopping, what its children report is the stop, not a failure of theirs (a stage that got
    the forwarded signal exits non-zero, and its dvc with it, sometimes before the signal interrupts our own wait):
    raise it as the interruption it is, `Terminated` for SIGTERM, else KeyboardInterrupt."""
    if _STOPPING.is_set():
        raise Terminated() if _STOP_SIGNAL[0] == signal.SIGTERM else KeyboardInterrupt()


def guarded(command: Sequence[str]) -> list[str]:
    """`command` behind the guard (see `guard`), to be started by this process itself, on Linux; unchanged
    elsewhere, where there is no parent-death signal to arm it with."""
    if not sys.platform.startswith("linux"):
        return list(command)
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid()), "--", *command]


def signal_group(pgid: int, sig: int) -> None:
    """Send `sig` to process group `pgid`, if it still exists."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def forward_stop(sig: int) -> None:
    """Pass a stop signal this command got on to the groups of its tied children (each in a session of its own, so
    neither a terminal's Ctrl-C nor a signal to our own group reaches them), and start nothing new from now on."""
    _STOP_SIGNAL[0] = sig
    _STOPPING.set()
    with _GROUPS_LOCK:
        groups = list(_GROUPS)
    for pgid in groups:
        signal_group(pgid, sig)


def _call_handler(handler: object, signum: int, frame: object) -> None:
    """Do what `handler`, as `signal.getsignal` returned it, does with `signum`."""
    if callable(handler):
        handler(signum, frame)
    elif handler == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


@contextlib.contextmanager
def stops_forwarded_first() -> Iterator[None]:
    """For the body, SIGTERM and Ctrl-C reach the tied children's groups before the handler installed now runs.

    Prefect's flow engine replaces `held`'s SIGTERM handler with its own, which first waits for the flow's running
    tasks, that is for the very `dvc repro` the signal should stop: `star run` hung until the stage finished."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def forward_then_handle(signum: int, frame: object) -> None:
        handler = previous[signum]
        if getattr(handler, "__func__", None) not in (_Lifeline.on_sigterm, _Lifeline.on_sigint):  # `held`'s forward
            forward_stop(signum)
        _call_handler(handler, signum, frame)

    for sig in previous:
        signal.signal(sig, forward_then_handle)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


@contextlib.contextmanager
def tied(command: Sequence[str], **popen_kwargs) -> Iterator[subprocess.Popen]:
    """Start `command` (with Popen's keywords) so that it does not outlive this process: in a process group of its
    own, led by the guard, which stops the group when we die, even by SIGKILL. SIGTERM and Ctrl-C that stop this
    `star` command (`held`) reach the group; leaving the block stops what still runs of it.

    Wait for the child in the thread that started it: the kernel's parent-death signal follows that thread, not
    the process."""
    with _GROUPS_LOCK:
        if stopping():
            raise Stopping(f"not starting {' '.join(map(str, command))}: this command is stopping")
        process = subprocess.Popen(guarded(command), start_new_session=True, **popen_kwargs)
        _GROUPS.add(process.pid)
    try:
        yield process
    finally:
        with _GROUPS_LOCK:
            _GROUPS.discard(process.pid)
        if process.poll() is None:
            signal_group(process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=GROUP_GRACE_SECONDS)
            signal_group(process.pid, signal.SIGKILL)
            process.wait()


class _Stop(Exception):
    """The guard's parent died, or someone asked the guard to stop."""


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop


def stop_group(pgid: int, grace_seconds: float, reap: Callable[[], object] = lambda: None) -> None:
    """SIGTERM every process of group `pgid` but this one; SIGKILL those left after `grace_seconds`."""
    def others() -> list[int]:
        return [pid for pid in group_members(pgid) if pid != os.getpid()]

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in others():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_seconds
        while others() and time.monotonic() < deadline:
            reap()
            time.sleep(0.1)
        reap()


def _exit_like(returncode: int) -> int:
    """Our exit status for a child that exited with `returncode`: the same code, or death by the same signal."""
    if returncode >= 0:
        return returncode
    with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP have no handler to reset
        signal.signal(-returncode, signal.SIG_DFL)
    os.kill(os.getpid(), -returncode)
    return 128 - returncode


def guard(parent_pid: int, command: Sequence[str], grace_seconds: float = GROUP_GRACE_SECONDS) -> int:
    """Run `command` and exit as it does; stop our whole process group when our parent dies or on SIGTERM/SIGHUP.

    The parent-death signal reaches only a process's direct child, and the processes that really serve or train
    are grandchildren (mlflow's uvicorn workers and job consumers, the stage under `dvc repro`): the guard, leader
    of their group, outlives them to stop them all. Ctrl-C reaches the whole group, so the guard leaves it to the
    child. Run it through `guarded`.
    """
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGHUP, _raise_stop)
    signal.signal(signal.SIGINT, lambda signum, frame: None)  # a handler, not SIG_IGN: the child must not inherit it
    child = None
    try:
        _set_parent_death_signal(signal.SIGTERM)
        if os.getppid() != parent_pid:  # the parent died before the death signal was armed
            raise _Stop
        child = subprocess.Popen(list(command), preexec_fn=lambda: _set_parent_death_signal(signal.SIGTERM))
        return _exit_like(child.wait())
    except _Stop:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stop_group(os.getpgrp(), grace_seconds, reap=child.poll if child else lambda: None)
        return 128 + signal.SIGTERM


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
        forward_stop(signal.SIGTERM)
        if self.launcher is not None and not is_alive(self.launcher):
            self.announce_gone()
        raise Terminated

    def on_sigint(self, signum: int, frame: object) -> None:
        """Ctrl-C: the tied children's groups get it too, then it is the usual KeyboardInterrupt."""
        forward_stop(signal.SIGINT)
        raise KeyboardInterrupt

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


def _raise_terminated(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not interrupt the cleanup it started
    raise Terminated


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """SIGTERM raises `Terminated` in the body where nothing else handles SIGTERM (code that opens an MLflow run
    outside `star`, whose `held` handles it already), so that `finally` blocks run; past the body it leaves as
    `SystemExit(143)`, the exit status SIGTERM's default action gives. Only the main thread can handle signals."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    except Terminated as stopped:
        raise SystemExit(Terminated.exit_code) from stopped
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def held(command: str, poll_seconds: float = POLL_SECONDS, grace_seconds: float = GRACE_SECONDS) -> Iterator[None]:
    """While `star <command>` runs: SIGTERM raises `Terminated` (a KeyboardInterrupt), both it and Ctrl-C are
    forwarded to the command's `tied` children, and a command started by dvc or Prefect stops once that launcher is
    gone. Nothing changes outside the main thread (signals are its alone)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    lifeline = _Lifeline(command, find_launcher(ancestors(os.getpid())))
    previous = signal.signal(signal.SIGTERM, lifeline.on_sigterm) or signal.SIG_DFL  # None: set outside Python
    previous_int = signal.getsignal(signal.SIGINT)
    if previous_int is signal.default_int_handler:
        signal.signal(signal.SIGINT, lifeline.on_sigint)
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
        if previous_int is signal.default_int_handler:
            signal.signal(signal.SIGINT, previous_int)
        _STOPPING.clear()


if __name__ == "__main__":  # the guard: python lifeline.py PARENT_PID -- COMMAND...
    sys.exit(guard(int(sys.argv[1]), sys.argv[3:]))
