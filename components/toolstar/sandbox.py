"""Run model-written Python behind a real isolation boundary: bubblewrap namespaces, a seccomp filter, resource
limits and, where the host allows it, a memory cgroup per run.

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
  read, reach the network, and a program that starts its own session and clears its environment can outlive the
  wall-clock limit where no memory cgroup is available.

What holds in both modes, even against a program that tampers with the sandbox's own processes:

- A small launcher sets the limits (CPU time, address space, processes and threads, file size, open files), then
  forks the interpreter that reads the program from stdin (nothing is written on the host) and waits for it. Under
  bubblewrap the launcher is the sandbox's PID 1 (`--as-pid-1`, no reaper of bubblewrap's in between): when it
  exits the kernel kills every process left in the sandbox, and signals the program sends it are ignored. It is
  not dumpable, so the program can neither trace it nor open its memory, and it reports the program's wait status
  and CPU time on a pipe only it holds: a program that ignores SIGXCPU and is killed at the hard limit is reported
  as the CPU limit.
- A seccomp filter (a classic-BPF program assembled here, `seccomp_filter()`) refuses with EPERM the system calls
  a program could use to tamper with other processes or the kernel: ptrace, process_vm_readv/writev, io_uring,
  the keyrings, bpf, perf_event_open, mounts and namespaces, module and kexec loading (`DENIED_SYSCALLS`), and
  every call made through another ABI than the machine's own (x86's 32-bit and x32 entry points). bubblewrap
  installs it (`--seccomp`); in rlimit mode the launcher does.
- Memory is limited per run, not only per process: each run gets its own cgroup (v2, or v1's memory hierarchy)
  whose limit is `memory_mib` for all of its processes together (files in its /tmp count), made where this process
  may create cgroups (as root, or in a delegated cgroup v2 subtree). Where no cgroup can be made, a warning is
  logged once and the worst case of one run is `memory_mib` times `max_processes`.
- A program still running at `wall_seconds` is killed with everything it started: its PID namespace (bubblewrap),
  its process group, its cgroup, and any process whose environment carries the run's marker (`ENV_MARKER`).
- Output is captured up to `max_output_bytes` (stdout and stderr together); a program that writes more is stopped
  and its output marked truncated. Control characters other than newline and tab are escaped (`\\x1b`), so no
  terminal sequence of the program's reaches a log or the model's observation raw.
- `SandboxResult.limit` names the limit a program ran into (`LIMITS`): its CPU time, memory, processes, open files,
  file size, a full /tmp, output or wall clock.

When the host runs as root the sandbox runs as `sandbox_uid` (the kernel never limits root's process count). Under
bubblewrap the process limit counts the sandbox's own processes (the launcher among them); in rlimit mode the
kernel counts all of the user's, so the limit is the user's current count plus `max_processes`.
"""
from __future__ import annotations

import errno
import functools
import logging
import os
import platform
import re
import selectors
import shutil
import signal
import struct
import subprocess
import sys
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

logger = logging.getLogger(__name__)

SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
LIMITS = ("cpu", "memory", "processes", "open_files", "file_size", "disk", "output", "wall")
MIB = 1024 * 1024
INSTALL_HINT = "install it with `apt-get install bubblewrap` (Debian/Ubuntu; `dnf install bubblewrap` on Fedora)"
RLIMIT_HINT = ("or set `isolation: rlimit` to run model code with resource limits only (no filesystem or network "
               "isolation: use it only on a machine you do not mind the code reading)")
ENV_MARKER = "TOOLSTAR_SANDBOX_RUN"  # set in every sandboxed process's environment (a run id): finds leftovers

# Runs inside the sandbox (`python -s -c LAUNCHER cpu mem nproc fsize nofile shared report seccomp`): set the limits,
# fork the interpreter that reads the program from stdin, wait for it (reaping the orphans it leaves: under
# bubblewrap this is the sandbox's PID 1) and write its wait status and CPU time to the `report` pipe. Set here,
# after bubblewrap made the user namespace, the process limit counts the sandbox's own processes only. Without a
# namespace (`shared` = 1) the kernel counts every task of the user, so the limit is what the user already runs plus
# `nproc`, and the launcher installs the seccomp filter (hex) itself. Not dumpable, it cannot be traced, nor its
# memory or its report pipe opened through /proc, by the program.
LAUNCHER = """\
import ctypes, os, resource, signal, sys
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
def install_seccomp(program):
    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    if prctl(38, 1, 0, 0, 0) or prctl(22, 2, ctypes.byref(Program(len(program) // 8, program)), 0, 0):
        raise OSError(ctypes.get_errno(), "the sandbox could not install its seccomp filter")
cpu, memory, processes, file_size, files, shared, report = map(int, sys.argv[1:8])
if shared:
    processes += tasks_of(os.getuid()) - 1  # the tasks the user runs besides this one
limit(resource.RLIMIT_CORE, 0)
soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1 if hard == resource.RLIM_INFINITY else min(cpu + 1, hard)))
limit(resource.RLIMIT_AS, memory)
limit(resource.RLIMIT_NPROC, processes)
limit(resource.RLIMIT_FSIZE, file_size)
limit(resource.RLIMIT_NOFILE, files)
if sys.argv[8]:
    install_seccomp(bytes.fromhex(sys.argv[8]))
ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
signal.signal(signal.SIGINT, signal.SIG_DFL)  # so that, as PID 1, the program's SIGINT is ignored too
os.set_inheritable(report, False)
program = os.fork()
if program == 0:
    os.closerange(3, files)
    os.execv(sys.executable, [sys.executable, "-s", "-u", "-"])
null = os.open("/dev/null", os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
while True:
    pid, status, usage = os.wait4(-1, 0)
    if pid == program:
        break
os.write(report, b"%d %.3f" % (status, usage.ru_utime + usage.ru_stime))
os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
"""

# Runs on the host where runs get a memory cgroup (`python -I -S -c CGROUP_SHIM cgroup.procs uid command...`): joins
# the run's cgroup while still this process's user (root may write there, the sandbox user may not), drops to the
# sandbox user (uid -1: stays), and executes the command, so that every process of the run starts in the cgroup.
CGROUP_SHIM = """\
import os, sys
procs, uid = sys.argv[1], int(sys.argv[2])
try:
    with open(procs, "w") as cgroup:
        cgroup.write(str(os.getpid()))
except OSError as exc:
    sys.stderr.write("toolstar sandbox: cannot join the run's memory cgroup %s (%s)\\n" % (procs, exc))
    os._exit(125)
if uid >= 0:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
os.execv(sys.argv[3], sys.argv[3:])
"""

# The system calls the seccomp filter refuses (EPERM), by number on (x86_64, aarch64). None of them has a use in a
# math or data snippet: they reach into other processes (the sandbox's own launcher included), open kernel attack
# surface (io_uring, keyrings, BPF, perf, userfaultfd), or change mounts, namespaces, modules, the clock or the host.
DENIED_SYSCALLS: dict[str, tuple[int | None, int | None]] = {
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "process_madvise": (440, 440), "pidfd_getfd": (438, 438), "kcmp": (312, 272),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218),
    "bpf": (321, 280), "perf_event_open": (298, 241), "userfaultfd": (323, 282), "fanotify_init": (300, 262),
    "mount": (165, 40), "umount2": (166, 39), "unshare": (272, 97), "setns": (308, 268), "pivot_root": (155, 41),
    "chroot": (161, 51), "open_tree": (428, 428), "move_mount": (429, 429), "fsopen": (430, 430),
    "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433), "mount_setattr": (442, 442),
    "name_to_handle_at": (303, 264), "open_by_handle_at": (304, 265),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294), "init_module": (175, 105),
    "finit_module": (313, 273), "delete_module": (176, 106),
    "acct": (163, 89), "swapon": (167, 224), "swapoff": (168, 225), "reboot": (169, 142),
    "sethostname": (170, 161), "setdomainname": (171, 162), "quotactl": (179, 60), "quotactl_fd": (443, 443),
    "lookup_dcookie": (212, 18), "settimeofday": (164, 170), "clock_settime": (227, 112), "adjtimex": (159, 171),
    "clock_adjtime": (305, 266), "syslog": (103, 116), "vhangup": (153, 58), "iopl": (172, None),
    "ioperm": (173, None),
}
SECCOMP_ARCHES = {"x86_64": (0, 0xC000003E), "aarch64": (1, 0xC00000B7)}  # column in DENIED_SYSCALLS, AUDIT_ARCH_*
X32_SYSCALL_BIT = 0x40000000  # x86_64's x32 ABI: the same arch in seccomp_data, numbers with this bit set


class SandboxUnavailable(UserError):
    """The requested isolation cannot be provided here (bubblewrap missing or unable to create namespaces)."""


class SandboxParams(Params):
    """How model-written Python runs: isolation mode and limits (the defaults suit short math snippets)."""

    isolation: Literal["bubblewrap", "rlimit"] = "bubblewrap"
    cpu_seconds: int = Field(5, ge=1, le=3600, description="CPU time of each process (SIGXCPU, then SIGKILL)")
    memory_mib: int = Field(512, ge=64, description="address space of each process (MemoryError beyond it) and, "
                                                    "where a cgroup can be made, memory of the whole run")
    max_processes: int = Field(16, ge=2, description="processes and threads of the program (the sandbox's "
                                                     "launcher counts too)")
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
    """What one run did. `limit` names the limit that stopped or broke the program (one of LIMITS), if any.
    stdout and stderr have their control characters escaped (`\\x1b`), newlines and tabs kept."""

    stdout: str
    stderr: str
    exit_code: int | None  # the program's exit status; None when a signal ended it
    signal: int | None  # the signal that ended it (SIGSEGV = 11, SIGKILL = 9, SIGXCPU = 24)
    limit: str | None
    truncated: bool  # output beyond max_output_bytes was dropped
    seconds: float  # wall-clock time of the run
    isolation: str
    error: str | None  # one sentence saying what went wrong; None when the program ran and exited with 0
    cpu_seconds: float = 0.0  # CPU time of the program (with the children it waited for); 0 when it was killed

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def exception(self) -> str | None:
        """The last line of stderr (for a traceback: the exception, e.g. `ZeroDivisionError: division by zero`)."""
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        return lines[-1].strip() if lines else None


@dataclass(frozen=True)
class MemoryCgroup:
    """A cgroup directory in which each run gets its own memory-limited cgroup: in the v2 hierarchy (with the
    memory controller given to its children) or in v1's memory hierarchy."""

    parent: str
    version: int  # 2 or 1


class Sandbox:
    """Runs Python code under `params`; checks at construction that the isolation asked for is available."""

    def __init__(self, params: SandboxParams | None = None):
        self.params = params or SandboxParams()
        self.python = resolve_python(self.params.python)
        self.uid = self.params.sandbox_uid if os.geteuid() == 0 else None
        self.cgroup = _memory_cgroup_or_warn(self.params)
        if self.params.isolation == "bubblewrap":
            self.bwrap = require_bubblewrap(self.python, self.params.library_dirs, self.uid, self.cgroup)
        else:
            self.bwrap = None
            _warn_rlimit_once()

    def run(self, code: str) -> SandboxResult:
        """Run `code` (a whole program) and report what happened; never raises for anything the code does."""
        if not isinstance(code, str):
            raise TypeError(f"code must be a str, got {type(code).__name__}")
        if self.bwrap is not None:
            return _execute(code, self.params, self.python, self.bwrap, self.uid, self.cgroup, cwd="/", home="/tmp")
        with tempfile.TemporaryDirectory(prefix="toolstar-sandbox-") as work:
            if self.uid is not None:
                os.chown(work, self.uid, self.uid)
            return _execute(code, self.params, self.python, None, self.uid, self.cgroup, cwd=work, home=work)


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


def require_bubblewrap(python: str, library_dirs: tuple[str, ...] = (), uid: int | None = None,
                       cgroup: MemoryCgroup | None = None) -> str:
    """The path of a `bwrap` that works here, or SandboxUnavailable saying how to get one."""
    bwrap = shutil.which("bwrap", path=SYSTEM_PATH + ":" + os.environ.get("PATH", ""))
    if bwrap is None:
        raise SandboxUnavailable(f"bubblewrap (`bwrap`) is not installed, so model-written Python cannot be "
                                 f"isolated: {INSTALL_HINT}, {RLIMIT_HINT}")
    problem = _bubblewrap_problem(bwrap, python, tuple(library_dirs), uid, cgroup)
    if problem:
        raise SandboxUnavailable(problem)
    return bwrap


@functools.lru_cache(maxsize=None)
def _bubblewrap_problem(bwrap: str, python: str, library_dirs: tuple[str, ...], uid: int | None,
                        cgroup: MemoryCgroup | None) -> str | None:
    """Run `print("ok")` through the real sandbox once; the reason it fails, or None."""
    params = SandboxParams(wall_seconds=60, library_dirs=library_dirs)
    try:
        result = _execute('print("ok")', params, python, bwrap, uid, cgroup, cwd="/", home="/tmp")
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
    elif any(sign in detail for sign in ("seccomp", "Unknown option", "--as-pid-1")):
        hint = ("this bubblewrap or kernel cannot install the sandbox's seccomp filter or run it as PID 1: "
                f"install bubblewrap 0.4 or newer on a kernel with seccomp ({INSTALL_HINT})")
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


def bubblewrap_argv(bwrap: str, python: str, params: SandboxParams, seccomp_fd: int | None = None) -> list[str]:
    """The `bwrap` command line up to the sandboxed command: namespaces, the launcher as PID 1, the seccomp filter
    read from `seccomp_fd`, read-only system, private /tmp (the only writable place, `tmp_mib` in size)."""
    argv = [bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--as-pid-1",
            "--hostname", "sandbox"]
    if _bwrap_supports(bwrap, "--disable-userns"):
        argv.append("--disable-userns")
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
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
        argv += ["--size", str(params.tmp_mib * MIB)]
    argv += ["--tmpfs", "/tmp"]
    # bwrap builds / and /dev as unbounded tmpfs mounts: read-only, so the size-limited /tmp is the only place to write
    argv += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp", "--"]
    return argv


def launcher_argv(python: str, params: SandboxParams, report_fd: int, namespaced: bool = True,
                  seccomp: bytes | None = None) -> list[str]:
    """The command that sets the limits (and, given `seccomp`, installs that filter), then runs the program from
    stdin and writes its status to `report_fd`."""
    return [python, "-s", "-c", LAUNCHER, str(params.cpu_seconds), str(params.memory_mib * MIB),
            str(params.max_processes), str(params.tmp_mib * MIB), str(params.max_open_files),
            "0" if namespaced else "1", str(report_fd), seccomp.hex() if seccomp else ""]


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


# --- the seccomp filter ----------------------------------------------------------------------------------------

def seccomp_filter(machine: str | None = None) -> bytes | None:
    """The seccomp program (a classic-BPF `struct sock_filter[]`, as bwrap's `--seccomp` reads it) that refuses
    DENIED_SYSCALLS with EPERM on `machine` (default: this one), and every call made through another ABI; None for
    an architecture without a syscall table here."""
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine or platform.machine(), machine or platform.machine())
    if machine not in SECCOMP_ARCHES:
        return None
    column, arch = SECCOMP_ARCHES[machine]
    numbers = sorted({row[column] for row in DENIED_SYSCALLS.values() if row[column] is not None})
    load, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
    allow, deny = 0x7FFF0000, 0x00050000 | errno.EPERM  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    checks = [(jge, X32_SYSCALL_BIT)] if machine == "x86_64" else []
    checks += [(jeq, number) for number in numbers]
    # [0] load arch, [1] native? skip the denial, [2] deny, [3] load nr, checks (each jumps to the last), allow, deny
    program = [(load, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, deny), (load, 0, 0, 0)]
    last = len(program) + len(checks) + 1
    for code, k in checks:
        program.append((code, last - len(program) - 1, 0, k))
    program += [(ret, 0, 0, allow), (ret, 0, 0, deny)]
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in program)


@functools.lru_cache(maxsize=None)
def _seccomp_program() -> bytes | None:
    program = seccomp_filter()
    if program is None:
        logger.warning("toolstar sandbox: no seccomp syscall table for %s (only %s): sandboxed programs run "
                       "without the filter that stops them tracing the sandbox's processes", platform.machine(),
                       ", ".join(SECCOMP_ARCHES))
    return program


def _seccomp_fd(program: bytes) -> int:
    """A memfd holding `program`, read from its start by bwrap."""
    fd = os.memfd_create("toolstar-seccomp")
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


# --- the memory cgroup of each run -----------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def find_memory_cgroup() -> tuple[MemoryCgroup | None, str]:
    """Where this process can make a memory-limited cgroup per run (v2 first, then v1's memory hierarchy), tried
    once by making one; else (None, why not)."""
    try:
        candidates = memory_cgroup_candidates(Path("/proc/self/cgroup").read_text(),
                                              Path("/proc/self/mountinfo").read_text())
    except (OSError, ValueError) as exc:
        return None, f"cannot read this process's cgroups ({exc})"
    problems = []
    for candidate in candidates:
        problem = _cgroup_problem(candidate)
        if problem is None:
            return candidate, ""
        problems.append(problem)
    return None, "; ".join(problems) or "no cgroup hierarchy with the memory controller is mounted"


def memory_cgroup_candidates(cgroups: str, mountinfo: str) -> list[MemoryCgroup]:
    """This process's cgroup in each mounted hierarchy that can limit memory, v2's first, then v1's memory one;
    from the texts of /proc/self/cgroup and /proc/self/mountinfo."""
    membership = {}  # controllers ("" for v2) -> path
    for line in cgroups.splitlines():
        _, controllers, path = line.split(":", 2)
        membership[controllers] = path
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        fs_type, super_options = fields[fields.index("-") + 1], fields[-1]
        if fs_type == "cgroup2":
            version, path = 2, membership.get("")
        elif fs_type == "cgroup" and "memory" in super_options.split(","):
            version = 1
            path = next((p for controllers, p in membership.items() if "memory" in controllers.split(",")), None)
        else:
            continue
        root, point = fields[3].rstrip("/"), fields[4]
        if path is None or not (path + "/").startswith(root + "/"):
            continue  # this process's cgroup is outside what the mount shows
        found.append(MemoryCgroup(os.path.join(point, path[len(root):].lstrip("/")).rstrip("/"), version))
    return sorted(found, key=lambda cgroup: -cgroup.version)


def _cgroup_problem(cgroup: MemoryCgroup) -> str | None:
    """Why runs cannot get their own memory cgroup under `cgroup` (tried with a short-lived process), or None."""
    parent = Path(cgroup.parent)
    if cgroup.version == 2:
        try:
            delegated = "memory" in (parent / "cgroup.subtree_control").read_text().split()
        except OSError as exc:
            return f"cgroup v2 at {parent} cannot be read ({exc.strerror})"
        if not delegated:
            return (f"cgroup v2 at {parent} does not give the memory controller to its children (`memory` is not "
                    "in its cgroup.subtree_control)")
    probe = parent / f"toolstar-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
    except OSError as exc:
        return f"cgroup v{cgroup.version} at {parent} does not let this process make a cgroup ({exc.strerror})"
    try:
        _limit_memory(probe, cgroup.version, 64 * MIB)
        subprocess.run(_shim_argv(probe, None, [sys.executable, "-I", "-S", "-c", ""]), check=True,
                       capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cgroup v{cgroup.version} at {parent} cannot limit a process's memory ({exc})"
    finally:
        _empty_and_remove(probe)
    return None


def _limit_memory(path: Path, version: int, limit: int) -> None:
    """Cap the memory of cgroup `path` at `limit` bytes, swap included (the swap files may be missing: no swap)."""
    memory, swap, swap_value = (("memory.max", "memory.swap.max", 0) if version == 2 else
                                ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes", limit))
    (path / memory).write_text(str(limit))
    try:
        (path / swap).write_text(str(swap_value))
    except OSError:
        pass


def _shim_argv(path: Path, uid: int | None, argv: list[str]) -> list[str]:
    """`argv` started inside cgroup `path`, as `uid` (None: this process's user)."""
    return [sys.executable, "-I", "-S", "-c", CGROUP_SHIM, str(path / "cgroup.procs"),
            str(-1 if uid is None else uid), *argv]


def _make_run_cgroup(cgroup: MemoryCgroup | None, run_id: str, params: SandboxParams) -> Path | None:
    """A new cgroup for one run, limited to `memory_mib`; None (logged) where it cannot be made this time."""
    if cgroup is None:
        return None
    path = Path(cgroup.parent) / f"toolstar-{run_id}"
    try:
        path.mkdir()
        _limit_memory(path, cgroup.version, params.memory_mib * MIB)
    except OSError as exc:
        logger.warning("toolstar sandbox: this run has no memory cgroup (%s: %s); its memory is limited per "
                       "process only", path, exc.strerror)
        _empty_and_remove(path)
        return None
    return path


def _oom_kills(path: Path, version: int) -> int:
    """How many processes the kernel killed for going over cgroup `path`'s memory limit."""
    try:
        events = (path / ("memory.events" if version == 2 else "memory.oom_control")).read_text()
    except OSError:
        return 0
    for line in events.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return 0


def _empty_and_remove(path: Path) -> None:
    """Kill every process left in cgroup `path` and remove it (giving them up to 5 s to go)."""
    end = time.monotonic() + 5
    while True:
        try:
            pids = [int(pid) for pid in (path / "cgroup.procs").read_text().split()]
        except FileNotFoundError:
            return
        except (OSError, ValueError):
            pids = []
        if not pids:
            try:
                path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                pass  # its last processes are still exiting
        for pid in pids:
            _kill(pid)
        if time.monotonic() > end:
            logger.warning("toolstar sandbox: cgroup %s still holds processes %s after 5 s; remove it once they "
                           "are gone (`rmdir %s`)", path, pids, path)
            return
        time.sleep(0.01)


_cgroup_fallback_logged = False


def _memory_cgroup_or_warn(params: SandboxParams) -> MemoryCgroup | None:
    """The place for runs' memory cgroups; where there is none, say once what that means for memory."""
    global _cgroup_fallback_logged
    cgroup, reason = find_memory_cgroup()
    if cgroup is None and not _cgroup_fallback_logged:
        _cgroup_fallback_logged = True
        logger.warning("toolstar sandbox: no memory cgroup per run here (%s), so memory is limited per process "
                       "only: one run can hold up to memory_mib x max_processes = %d MiB, plus its /tmp. Run as "
                       "root or in a cgroup v2 subtree delegated to this user (e.g. `systemd-run --user --scope "
                       "-p Delegate=yes ...`) to limit each run as a whole", reason,
                       params.memory_mib * params.max_processes)
    return cgroup


# --- running one program ---------------------------------------------------------------------------------------

def _execute(code: str, params: SandboxParams, python: str, bwrap: str | None, uid: int | None,
             cgroup: MemoryCgroup | None, cwd: str, home: str) -> SandboxResult:
    """Start the sandbox (bubblewrap when `bwrap` is given) with `code` on stdin, pump its output within the limits,
    stop everything it started, and read what happened."""
    isolation = "bubblewrap" if bwrap else "rlimit"
    run_id = uuid.uuid4().hex
    run_cgroup = _make_run_cgroup(cgroup, run_id, params)
    report_read, report_write = os.pipe()
    program = _seccomp_program()
    seccomp_fd = _seccomp_fd(program) if bwrap and program else None
    try:
        argv, as_user = _command(params, python, bwrap, uid, run_cgroup, report_write, seccomp_fd, program)
        start = time.monotonic()
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=sandbox_env(params, home, run_id), cwd=cwd, start_new_session=True,
                                pass_fds=[fd for fd in (report_write, seccomp_fd) if fd is not None], **as_user)
        os.close(report_write)
        report_write = None
        try:
            out, err, stopped = _pump(proc, code.encode("utf-8", "replace"), params.max_output_bytes,
                                      start + params.wall_seconds)
            if not _exited_by(proc.pid, start + params.wall_seconds if stopped is None else 0.0):
                stopped = stopped or "wall"
        finally:
            _stop(proc.pid, bwrap is not None)
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                stream.close()
            _, status, usage = os.wait4(proc.pid, 0)  # reaped here, not by Popen: the rusage gives the CPU time
            proc.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.monotonic() - start
        oom_kills = _oom_kills(run_cgroup, cgroup.version) if run_cgroup is not None else 0
        report = _read_report(report_read)
    finally:
        for fd in (report_read, report_write, seccomp_fd):
            if fd is not None:
                os.close(fd)
        if run_cgroup is not None:
            _empty_and_remove(run_cgroup)
        _sweep(run_id)
    cpu = report[1] if report else usage.ru_utime + usage.ru_stime
    exit_code, sig = _decode_status(report[0]) if report else _decode_status(status, through_bwrap=bwrap is not None)
    return _result(out, err, exit_code, sig, cpu, stopped, oom_kills, params, seconds, isolation)


def _command(params: SandboxParams, python: str, bwrap: str | None, uid: int | None, run_cgroup: Path | None,
             report_fd: int, seccomp_fd: int | None, seccomp: bytes | None) -> tuple[list[str], dict]:
    """The command line of one run, and the user to start it as (Popen's `user`, `group`, `extra_groups`)."""
    if bwrap:
        argv = bubblewrap_argv(bwrap, python, params, seccomp_fd) + launcher_argv(python, params, report_fd)
    else:
        argv = launcher_argv(python, params, report_fd, namespaced=False, seccomp=seccomp)
    if run_cgroup is not None:
        return _shim_argv(run_cgroup, uid, argv), {}  # the shim joins the cgroup, then drops to uid itself
    return argv, ({"user": uid, "group": uid, "extra_groups": []} if uid is not None else {})


def _read_report(fd: int) -> tuple[int, float] | None:
    """(wait status, CPU seconds) of the program as its launcher reported them; None when the launcher did not get
    to report (it was killed with the run)."""
    os.set_blocking(fd, False)
    try:
        status, cpu = os.read(fd, 256).split()
        return int(status), float(cpu)
    except (BlockingIOError, ValueError):
        return None


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
    sandbox's PID 1, the launcher: killing it makes the kernel kill every process in the sandbox's PID namespace,
    and bwrap exits once that is done. Then the process group goes (in rlimit mode: the program and the children
    it started); the run's cgroup and its marker (`_sweep`) catch the processes that left the group."""
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
    """Kill processes of this run that outlived it (found by ENV_MARKER in their environment; both modes, as a last
    line behind the PID namespace and the cgroup)."""
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


def _decode_status(status: int, through_bwrap: bool = False) -> tuple[int | None, int | None]:
    """(exit code, signal) from a wait status: the program's own (its launcher's report), or bwrap's, which reports
    a child killed by signal N as exit status 128 + N."""
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    code = os.WEXITSTATUS(status)
    if through_bwrap and 128 < code < 128 + 65:
        return None, code - 128
    return code, None


# errno of the last traceback line -> the limit it means
ERRNO_LIMITS = {errno.ENOSPC: "disk", errno.EFBIG: "file_size", errno.EMFILE: "open_files", errno.ENOMEM: "memory"}
_CONTROL_CHARACTERS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(data: bytes) -> str:
    """`data` decoded as UTF-8 with every control character but newline and tab escaped as `\\xNN`, so that no
    terminal sequence, carriage return or NUL a program writes reaches a log or the model raw."""
    return _CONTROL_CHARACTERS.sub(lambda match: f"\\x{ord(match.group()):02x}", data.decode("utf-8", "replace"))


def _result(out: bytes, err: bytes, exit_code: int | None, sig: int | None, cpu: float, stopped: str | None,
            oom_kills: int, params: SandboxParams, seconds: float, isolation: str) -> SandboxResult:
    stderr = err.decode("utf-8", "replace")
    last = next((line.strip() for line in reversed(stderr.splitlines()) if line.strip()), "")
    limit = stopped or _limit_reached(exit_code, sig, cpu, oom_kills, last, params)
    return SandboxResult(stdout=printable(out), stderr=printable(err), exit_code=exit_code, signal=sig, limit=limit,
                         truncated=stopped == "output", seconds=round(seconds, 3), isolation=isolation,
                         error=_describe(exit_code, sig, limit, params), cpu_seconds=round(cpu, 3))


def _limit_reached(exit_code: int | None, sig: int | None, cpu: float, oom_kills: int, last: str,
                   params: SandboxParams) -> str | None:
    """The limit (of LIMITS) that ended or broke the program: from the signal that killed it, its CPU time, the
    kernel's OOM kills in its cgroup, or the error on the last line of its stderr."""
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and not oom_kills and cpu >= params.cpu_seconds * 0.9):
        return "cpu"
    if oom_kills:
        return "memory"
    if sig == signal.SIGXFSZ:
        return "file_size"
    if exit_code in (0, None):
        return None
    if last.startswith("MemoryError"):
        return "memory"
    for number, limit in ERRNO_LIMITS.items():
        if f"[Errno {number}]" in last:
            return limit
    if "Resource temporarily unavailable" in last or "can't start new thread" in last:
        return "processes"
    return None


def _describe(exit_code: int | None, sig: int | None, limit: str | None, params: SandboxParams) -> str | None:
    messages = {
        "wall": f"the program was stopped after the {params.wall_seconds:g} s time limit",
        "output": f"the program was stopped: its output passed {params.max_output_bytes} bytes (truncated)",
        "cpu": f"the program was stopped after {params.cpu_seconds} s of CPU time",
        "memory": f"the program ran out of memory (limit {params.memory_mib} MiB)",
        "processes": f"the program could not start more processes or threads (limit {params.max_processes})",
        "open_files": f"the program could not open more files (limit {params.max_open_files} open at once)",
        "file_size": f"the program could not write a file larger than {params.tmp_mib} MiB",
        "disk": f"the program filled its /tmp (limit {params.tmp_mib} MiB)",
    }
    if limit is not None:
        return messages[limit]
    if sig is not None:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"the program was killed by {name}"
    if exit_code:
        return f"the program exited with status {exit_code}"
    return None
