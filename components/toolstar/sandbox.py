"""Run model-written Python behind a real isolation boundary: bubblewrap namespaces plus resource limits.

`Sandbox(params).run(code) -> SandboxResult` runs `code` in a fresh interpreter and never raises for anything the
code does: a crash, a limit, a signal or a huge output all come back as values, which the environment turns into an
error observation. Isolation is chosen by `SandboxParams.isolation`:

- `"bubblewrap"` (the default): the interpreter runs under `bwrap` with every namespace unshared (no network, not
  even the host's loopback; its own PID space; no other user namespaces inside), the system directories bound
  read-only, a private size-limited `/tmp` as the only writable place, and nothing else of the host: not the
  project directory, not `$HOME`. `--die-with-parent` ties it to this process and `--new-session` detaches it from
  any terminal. Where `bwrap` is missing or cannot create namespaces, constructing the sandbox fails with an error
  that says how to fix it; the check runs once per interpreter and is cached.
- `"rlimit"`: resource limits only, an explicit opt-in that warns once: the code can read what the sandbox user can
  read, reach the network, and a program that starts its own session can outlive the wall-clock limit.

In both modes the program gets limits on CPU time, address space (memory), processes (threads count), file size
and open files, set inside the sandbox by a small launcher before it executes the interpreter on the code (read
from stdin, so nothing is written on the host). Output is captured up to `max_output_bytes` (stdout and stderr
together); a program that writes more is stopped and its output marked truncated. A program still running at
`wall_seconds` is killed with everything it started. When the host runs as root the sandbox runs as
`sandbox_uid` (the kernel never limits root's process count). Under bubblewrap the process limit counts the
sandbox's own processes; in rlimit mode the kernel counts all of the user's, so the limit is the user's current
count plus `max_processes`.
"""
from __future__ import annotations

import functools
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from components.errors import UserError
from components.params import Params

SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
LIMITS = ("cpu", "memory", "processes", "output", "wall")
INSTALL_HINT = "install it with `apt-get install bubblewrap` (Debian/Ubuntu; `dnf install bubblewrap` on Fedora)"
RLIMIT_HINT = ("or set `isolation: rlimit` to run model code with resource limits only (no filesystem or network "
               "isolation: use it only on a machine you do not mind the code reading)")
ENV_MARKER = "TOOLSTAR_SANDBOX_RUN"  # set in every sandboxed process's environment (a run id): finds leftovers

# Runs inside the sandbox (`python -s -c LAUNCHER cpu mem nproc fsize nofile shared`): set the limits, then become
# the interpreter that reads the program from stdin. Set here, after bubblewrap made the user namespace, the process
# limit counts the sandbox's own processes only. Without a namespace (`shared` = 1) the kernel counts every task of
# the user, so the limit is what the user already runs plus `nproc`.
LAUNCHER = """\
import os, resource, sys
def limit(kind, value):
    soft, hard = resource.getrlimit(kind)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(kind, (value, value))
def tasks_of(uid):
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat("/proc/" + pid).st_uid == uid:
                count += len(os.listdir("/proc/" + pid + "/task"))
        except OSError:
            count += 1
    return count
cpu, memory, processes, file_size, files, shared = map(int, sys.argv[1:7])
if shared:
    processes += tasks_of(os.getuid()) - 1  # the tasks the user runs besides this one
limit(resource.RLIMIT_CORE, 0)
soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1 if hard == resource.RLIM_INFINITY else min(cpu + 1, hard)))
limit(resource.RLIMIT_AS, memory)
limit(resource.RLIMIT_NPROC, processes)
limit(resource.RLIMIT_FSIZE, file_size)
limit(resource.RLIMIT_NOFILE, files)
os.execv(sys.executable, [sys.executable, "-s", "-u", "-"])
"""


class SandboxUnavailable(UserError):
    """The requested isolation cannot be provided here (bubblewrap missing or unable to create namespaces)."""


class SandboxParams(Params):
    """How model-written Python runs: isolation mode and limits (the defaults suit short math snippets)."""

    isolation: Literal["bubblewrap", "rlimit"] = "bubblewrap"
    cpu_seconds: int = Field(5, ge=1, le=3600, description="CPU time of each process (SIGXCPU, then SIGKILL)")
    memory_mib: int = Field(512, ge=64, description="address space of each process (MemoryError beyond it)")
    max_processes: int = Field(16, ge=2, description="processes and threads of the program (under bubblewrap its "
                                                     "init counts too)")
    max_output_bytes: int = Field(65536, ge=256, description="stdout + stderr kept; more stops the program")
    wall_seconds: float = Field(10.0, gt=0, le=3600, description="wall-clock time before everything is killed")
    tmp_mib: int = Field(64, ge=1, description="size of the private /tmp and of any file written")
    max_open_files: int = Field(64, ge=16, description="open file descriptors of each process")
    python: str = Field("python3", description=f"interpreter: a name looked up on {SYSTEM_PATH} or an absolute "
                                               "path (never the project's virtualenv, which lives in the project)")
    library_dirs: tuple[str, ...] = Field((), description="directories bound read-only and put on sys.path "
                                                          "(e.g. a site-packages holding numpy and sympy)")
    sandbox_uid: int = Field(65534, ge=1, description="the user the sandbox runs as when the host runs as root")

    @field_validator("library_dirs")
    @classmethod
    def _absolute(cls, dirs: tuple[str, ...]) -> tuple[str, ...]:
        relative = [d for d in dirs if not os.path.isabs(d)]
        if relative:
            raise ValueError(f"library_dirs must be absolute paths (bound at the same place in the sandbox): "
                             f"{relative}")
        return dirs


@dataclass(frozen=True)
class SandboxResult:
    """What one run did. `limit` names the limit that stopped or broke the program (one of LIMITS), if any."""

    stdout: str
    stderr: str
    exit_code: int | None  # the program's exit status; None when a signal ended it
    signal: int | None  # the signal that ended it (SIGSEGV = 11, SIGKILL = 9, SIGXCPU = 24)
    limit: str | None
    truncated: bool  # output beyond max_output_bytes was dropped
    seconds: float  # wall-clock time of the run
    isolation: str
    error: str | None  # one sentence saying what went wrong; None when the program ran and exited with 0

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def exception(self) -> str | None:
        """The last line of stderr (for a traceback: the exception, e.g. `ZeroDivisionError: division by zero`)."""
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        return lines[-1].strip() if lines else None


class Sandbox:
    """Runs Python code under `params`; checks at construction that the isolation asked for is available."""

    def __init__(self, params: SandboxParams | None = None):
        self.params = params or SandboxParams()
        self.python = resolve_python(self.params.python)
        self.uid = self.params.sandbox_uid if os.geteuid() == 0 else None
        if self.params.isolation == "bubblewrap":
            self.bwrap = require_bubblewrap(self.python, self.params.library_dirs, self.uid)
        else:
            self.bwrap = None
            _warn_rlimit_once()

    def run(self, code: str) -> SandboxResult:
        """Run `code` (a whole program) and report what happened; never raises for anything the code does."""
        if not isinstance(code, str):
            raise TypeError(f"code must be a str, got {type(code).__name__}")
        if self.bwrap is not None:
            argv = bubblewrap_argv(self.bwrap, self.python, self.params) + launcher_argv(self.python, self.params)
            return _execute(argv, code, self.params, self.uid, cwd="/", home="/tmp", isolation="bubblewrap")
        with tempfile.TemporaryDirectory(prefix="toolstar-sandbox-") as work:
            if self.uid is not None:
                os.chown(work, self.uid, self.uid)
            argv = launcher_argv(self.python, self.params, namespaced=False)
            return _execute(argv, code, self.params, self.uid, cwd=work, home=work, isolation="rlimit")


def isolation_problem(params: SandboxParams | None = None) -> str | None:
    """Why a sandbox with `params` cannot be built here (the message `Sandbox` would raise), or None."""
    try:
        Sandbox(params)
    except SandboxUnavailable as exc:
        return str(exc)
    return None


def resolve_python(python: str) -> str:
    """The real path of the sandbox interpreter: an absolute path, or a name found on the system PATH."""
    found = python if os.path.isabs(python) else shutil.which(python, path=SYSTEM_PATH)
    if not found or not os.access(found, os.X_OK):
        raise SandboxUnavailable(f"no Python interpreter {python!r} (searched {SYSTEM_PATH}): install python3 or set "
                                 "`python:` to the absolute path of an interpreter outside the project")
    return os.path.realpath(found)


def require_bubblewrap(python: str, library_dirs: tuple[str, ...] = (), uid: int | None = None) -> str:
    """The path of a `bwrap` that works here, or SandboxUnavailable saying how to get one."""
    bwrap = shutil.which("bwrap", path=SYSTEM_PATH + ":" + os.environ.get("PATH", ""))
    if bwrap is None:
        raise SandboxUnavailable(f"bubblewrap (`bwrap`) is not installed, so model-written Python cannot be "
                                 f"isolated: {INSTALL_HINT}, {RLIMIT_HINT}")
    problem = _bubblewrap_problem(bwrap, python, tuple(library_dirs), uid)
    if problem:
        raise SandboxUnavailable(problem)
    return bwrap


@functools.lru_cache(maxsize=None)
def _bubblewrap_problem(bwrap: str, python: str, library_dirs: tuple[str, ...], uid: int | None) -> str | None:
    """Run `print("ok")` through the real sandbox once; the reason it fails, or None."""
    params = SandboxParams(wall_seconds=60, library_dirs=library_dirs)
    argv = bubblewrap_argv(bwrap, python, params) + launcher_argv(python, params)
    try:
        result = _execute(argv, 'print("ok")', params, uid, cwd="/", home="/tmp", isolation="bubblewrap")
    except OSError as exc:
        return f"bubblewrap at {bwrap} could not be started ({exc}): reinstall it ({INSTALL_HINT}), {RLIMIT_HINT}"
    if result.ok and result.stdout.strip() == "ok":
        return None
    detail = " | ".join(line for line in result.stderr.strip().splitlines()[-3:]) or result.error or "no output"
    if any(sign in detail for sign in ("namespace", "uid map", "RTM_NEWADDR", "Operation not permitted")):
        hint = ("this machine does not let it create user namespaces: enable them (`sysctl -w "
                "kernel.unprivileged_userns_clone=1`; Ubuntu 24.04+: `sysctl -w "
                "kernel.apparmor_restrict_unprivileged_userns=0`; in Docker: `--security-opt seccomp=unconfined`, "
                "or install bwrap setuid)")
    else:
        user = uid if uid is not None else os.geteuid()
        hint = (f"check that {python} and every library_dirs entry can be read by user {user} (an interpreter "
                "under $HOME, such as pyenv's, cannot: use the system one, `python: python3`)")
    return f"bubblewrap at {bwrap} cannot run the sandbox here ({detail}): {hint}, {RLIMIT_HINT}"


@functools.lru_cache(maxsize=None)
def _bwrap_supports(bwrap: str, option: str) -> bool:
    try:
        help_text = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return option in help_text


def bubblewrap_argv(bwrap: str, python: str, params: SandboxParams) -> list[str]:
    """The `bwrap` command line up to the sandboxed command: namespaces, read-only system, private /tmp (the only
    writable place, `tmp_mib` in size)."""
    argv = [bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session",
            "--hostname", "sandbox"]
    if _bwrap_supports(bwrap, "--disable-userns"):
        argv.append("--disable-userns")
    argv += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    for path in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/localtime"):
        argv += ["--ro-bind-try", path, path]
    parents = Path(python).parents
    prefix = str(parents[1]) if len(parents) > 1 else "/"
    if prefix != "/" and not (prefix + "/").startswith("/usr/"):  # an interpreter outside /usr: its prefix only
        argv += ["--ro-bind", prefix, prefix]
    for directory in params.library_dirs:
        argv += ["--ro-bind", directory, directory]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    if _bwrap_supports(bwrap, "--size"):
        argv += ["--size", str(params.tmp_mib * 1024 * 1024)]
    argv += ["--tmpfs", "/tmp"]
    # bwrap builds / and /dev as unbounded tmpfs mounts: read-only, so the size-limited /tmp is the only place to write
    argv += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp", "--"]
    return argv


def launcher_argv(python: str, params: SandboxParams, namespaced: bool = True) -> list[str]:
    """The command that sets the limits and then runs the program from stdin."""
    mib = 1024 * 1024
    return [python, "-s", "-c", LAUNCHER, str(params.cpu_seconds), str(params.memory_mib * mib),
            str(params.max_processes), str(params.tmp_mib * mib), str(params.max_open_files),
            "0" if namespaced else "1"]


def sandbox_env(params: SandboxParams, home: str, run_id: str) -> dict[str, str]:
    """The whole environment of the sandboxed program (nothing is inherited from the host)."""
    env = {"PATH": SYSTEM_PATH, "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8",
           "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1", ENV_MARKER: run_id}
    if params.library_dirs:
        env["PYTHONPATH"] = os.pathsep.join(params.library_dirs)
    return env


_rlimit_warned = False


def _warn_rlimit_once() -> None:
    global _rlimit_warned
    if not _rlimit_warned:
        _rlimit_warned = True
        warnings.warn("toolstar sandbox isolation is 'rlimit': model-written Python runs with resource limits only, "
                      "it can read host files and reach the network, and a program that starts its own session can "
                      "outlive its time limit; install bubblewrap (`apt-get install bubblewrap`) and use "
                      "isolation: bubblewrap", RuntimeWarning, stacklevel=3)


def _execute(argv: list[str], code: str, params: SandboxParams, uid: int | None, cwd: str, home: str,
             isolation: str) -> SandboxResult:
    """Start `argv` with `code` on stdin, pump its output within the limits, stop it, and read its status."""
    run_id = uuid.uuid4().hex
    user = {"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=sandbox_env(params, home, run_id), cwd=cwd, start_new_session=True, **user)
    try:
        out, err, stopped = _pump(proc, code.encode("utf-8", "replace"), params.max_output_bytes,
                                  start + params.wall_seconds)
        if not _exited_by(proc.pid, start + params.wall_seconds if stopped is None else 0.0):
            stopped = stopped or "wall"
    finally:
        _stop(proc.pid, isolation == "bubblewrap")
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            stream.close()
        _, status, usage = os.wait4(proc.pid, 0)  # reaped here, not by Popen: the rusage gives the CPU time
        proc.returncode = os.waitstatus_to_exitcode(status)
    if isolation == "rlimit":
        _sweep(run_id)
    return _result(out, err, status, usage.ru_utime + usage.ru_stime, stopped, params,
                   time.monotonic() - start, isolation)


def _pump(proc: subprocess.Popen, code: bytes, cap: int, deadline: float) -> tuple[bytes, bytes, str | None]:
    """Feed stdin and read stdout/stderr until both close, the deadline passes ("wall") or the output passes
    `cap` ("output"); returns what was read (at most `cap` bytes in all) and the limit that ended it, if any."""
    out_fd, err_fd, in_fd = proc.stdout.fileno(), proc.stderr.fileno(), proc.stdin.fileno()
    chunks: dict[int, list[bytes]] = {out_fd: [], err_fd: []}
    total, pending = 0, memoryview(code)
    with selectors.DefaultSelector() as selector:
        for fd in (out_fd, err_fd, in_fd):
            os.set_blocking(fd, False)
        selector.register(out_fd, selectors.EVENT_READ)
        selector.register(err_fd, selectors.EVENT_READ)
        selector.register(in_fd, selectors.EVENT_WRITE)
        while out_fd in selector.get_map() or err_fd in selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return b"".join(chunks[out_fd]), b"".join(chunks[err_fd]), "wall"
            events = selector.select(min(remaining, 0.05))
            if not events and _exited_by(proc.pid, 0.0):
                break  # the program is gone and nothing is left to read (a child it left may hold the pipes)
            for key, _ in events:
                if key.fd == in_fd:
                    try:
                        pending = pending[os.write(in_fd, pending[:65536]):]
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:  # the program ended without reading all of its code
                        pending = pending[:0]
                    if not pending:
                        selector.unregister(in_fd)
                        proc.stdin.close()
                    continue
                try:
                    data = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                if not data:
                    selector.unregister(key.fd)
                    continue
                chunks[key.fd].append(data[:max(0, cap - total)])
                total += len(data)
                if total > cap:
                    return b"".join(chunks[out_fd]), b"".join(chunks[err_fd]), "output"
    return b"".join(chunks[out_fd]), b"".join(chunks[err_fd]), None


def _exited_by(pid: int, deadline: float) -> bool:
    """Whether process `pid` has exited by `deadline`, without reaping it (so its PID and group stay reserved)."""
    while True:
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)


def _stop(pid: int, bubblewrap: bool) -> None:
    """Kill whatever is left of the run started as `pid` (not yet reaped). Under bubblewrap its child is the
    sandbox's PID 1: killing it makes the kernel kill every process in the sandbox's PID namespace, and bwrap exits
    once that is done. Then the process group goes (in rlimit mode: the program and the children it started)."""
    if bubblewrap:
        for child in _children(pid):
            _kill(child)
        end = time.monotonic() + 10
        while time.monotonic() < end and os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            time.sleep(0.005)
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _children(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _sweep(run_id: str) -> None:
    """rlimit mode: kill processes of this run that left its process group (best effort: found by ENV_MARKER)."""
    marker, end = f"{ENV_MARKER}={run_id}".encode(), time.monotonic() + 2
    while (pids := leftover_processes(marker)) and time.monotonic() < end:
        for pid in pids:
            _kill(pid)
        time.sleep(0.01)


def leftover_processes(marker: bytes = ENV_MARKER.encode() + b"=") -> list[int]:
    """PIDs of live processes whose environment holds `marker` (by default: any sandboxed process)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in environ and _alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def _decode_status(status: int, isolation: str) -> tuple[int | None, int | None]:
    """(exit code, signal). bwrap reports a child killed by signal N as exit status 128 + N."""
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    code = os.WEXITSTATUS(status)
    if isolation == "bubblewrap" and 128 < code < 128 + 65:
        return None, code - 128
    return code, None


def _result(out: bytes, err: bytes, status: int, cpu: float, stopped: str | None, params: SandboxParams,
            seconds: float, isolation: str) -> SandboxResult:
    stdout, stderr = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    exit_code, sig = _decode_status(status, isolation)
    limit = stopped
    last = next((line.strip() for line in reversed(stderr.splitlines()) if line.strip()), "")
    if limit is None and sig in (signal.SIGXCPU, signal.SIGKILL) and (
            sig == signal.SIGXCPU or cpu >= params.cpu_seconds * 0.9):
        limit = "cpu"
    elif limit is None and exit_code not in (0, None) and last.startswith("MemoryError"):
        limit = "memory"
    elif limit is None and exit_code not in (0, None) and (
            "Resource temporarily unavailable" in last or "can't start new thread" in last):
        limit = "processes"
    return SandboxResult(stdout=stdout, stderr=stderr, exit_code=exit_code, signal=sig, limit=limit,
                         truncated=stopped == "output", seconds=round(seconds, 3), isolation=isolation,
                         error=_describe(exit_code, sig, limit, params))


def _describe(exit_code: int | None, sig: int | None, limit: str | None, params: SandboxParams) -> str | None:
    if limit == "wall":
        return f"the program was stopped after the {params.wall_seconds:g} s time limit"
    if limit == "output":
        return f"the program was stopped: its output passed {params.max_output_bytes} bytes (truncated)"
    if limit == "cpu":
        return f"the program was stopped after {params.cpu_seconds} s of CPU time"
    if limit == "memory":
        return f"the program ran out of memory (limit {params.memory_mib} MiB)"
    if limit == "processes":
        return f"the program could not start more processes or threads (limit {params.max_processes})"
    if sig is not None:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"the program was killed by {name}"
    if exit_code:
        return f"the program exited with status {exit_code}"
    return None
