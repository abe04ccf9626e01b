"""Hostile programs against the bubblewrap sandbox: one table of (program, what "contained" means for it).

Each program tries one way out: reading or writing the host, reaching the host's network, outliving its run
(daemons, tampering with the sandbox's own launcher), or going past a limit (forking, threads, raising its limits,
ignoring SIGXCPU, filling /tmp, opening files, memory across several children). Each row asserts the outcome a
contained run has; after every row no process of the sandbox is left on the host (by its run marker, and by a
name only that row's daemons carry). Skipped, with the reason, where bubblewrap cannot run.
"""
from __future__ import annotations

import errno
import os
import platform
import re
import socket
import subprocess
import textwrap
import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from string import Template
from typing import Callable

import pytest

from components.toolstar.protocol import python_observation
from components.toolstar.sandbox import (
    DENIED_SYSCALLS,
    SECCOMP_ARCHES,
    Sandbox,
    SandboxParams,
    SandboxResult,
    find_memory_cgroup,
    isolation_problem,
    leftover_processes,
)

REPO = Path(__file__).resolve().parents[2]
# Small limits keep the suite quick: 1 s of CPU, 3 s of wall clock, 256 MiB, a 16 MiB /tmp.
HOSTILE = {"cpu_seconds": 1, "wall_seconds": 3, "memory_mib": 256, "tmp_mib": 16}
SLOW_CPU = {"wall_seconds": 10}  # rows that must reach the CPU limit (2 s with the grace second) on a busy machine
MACHINE = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine(), platform.machine())
NEEDS_CGROUP = "needs a memory cgroup per run"
NEEDS_SECCOMP = "needs a seccomp syscall table for this machine"
COLUMN = SECCOMP_ARCHES.get(MACHINE, (0,))[0]  # this machine's column in DENIED_SYSCALLS
LIBC = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"


def with_libc(code: str) -> str:
    """`code` after the lines that load libc through ctypes (as `libc`, errno kept)."""
    return LIBC + textwrap.dedent(code)


@dataclass
class Host:
    """What the host offers the program to reach: listeners on 127.0.0.1 and an abstract unix socket, a process
    of the sandbox's own user, and a name only this row's daemons carry."""

    tcp: socket.socket
    udp: socket.socket
    unix: socket.socket
    unix_name: str
    neighbour: subprocess.Popen
    token: str = field(default_factory=lambda: f"toolstar-daemon-{uuid.uuid4().hex}")

    def fill(self, code: str) -> str:
        return Template(textwrap.dedent(code)).safe_substitute(
            tcp_port=self.tcp.getsockname()[1], udp_port=self.udp.getsockname()[1], unix=self.unix_name,
            token=self.token, repo=str(REPO), home=os.path.expanduser("~"), neighbour=self.neighbour.pid)

    def udp_received(self) -> bytes | None:
        try:
            return self.udp.recv(100)
        except BlockingIOError:
            return None


def processes_named(token: str) -> list[int]:
    """Live processes whose command line carries `token` (a daemon that cleared its environment has no marker)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or token.encode() not in (entry / "cmdline").read_bytes():
                continue
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":  # zombies are gone but unreaped
                found.append(int(entry.name))
        except OSError:
            continue
    return found


# --- expectations: each takes (result, host) and asserts what "contained" means ------------------------------

Expectation = Callable[[SandboxResult, Host], None]


def limit(name: str, stdout: str | None = None) -> Expectation:
    def check(result, host):
        assert result.limit == name and not result.ok, result
        assert stdout is None or result.stdout == stdout, result
    return check


def stopped_by_a_limit(result, host):
    assert not result.ok and result.limit in ("processes", "cpu", "wall"), result


def prints(*lines: str, exit_code: int = 0) -> Expectation:
    def check(result, host):
        assert result.stdout.splitlines() == list(lines) and result.exit_code == exit_code, result
    return check


def raises(exception: str) -> Expectation:
    def check(result, host):
        assert not result.ok and result.exception and result.exception.startswith(exception), result
    return check


def ends_at_once_and_nothing_stays(result, host):
    """A daemon: the call returns when the program does (not at the wall clock), and the daemon is gone."""
    assert result.ok and result.seconds < 2.5, result
    assert processes_named(host.token) == [], "a daemon of the program outlived its run"


def nothing_reached_the_udp_listener(result, host):
    assert result.ok and result.stdout == "sent\n", result
    time.sleep(0.1)
    assert host.udp_received() is None


def the_neighbour_survives(result, host):
    assert host.neighbour.poll() is None, "kill(-1) in the sandbox reached a host process of the same user"
    assert result.stdout == "killed everything it could see\n", result


def escaped_control_characters(result, host):
    observation = python_observation(result)
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f]", observation), repr(observation)
    assert "\\x1b]0;owned\\x07" in result.stderr and "\\x0d\\x00evil" in result.stderr, result


def truncated_and_escaped(result, host):
    assert result.limit == "output" and result.truncated, result
    assert "\x1b" not in result.stderr and "\\x1b[31m" in result.stderr


def memory_across_children(result, host):
    assert result.limit == "memory" and "out of memory" in result.error, result
    held = int(result.stdout.split()[0])
    assert held <= 2, f"{held} children held 100 MiB each at once under a 256 MiB limit"


# --- the table -------------------------------------------------------------------------------------------------

@dataclass
class Hostile:
    name: str
    code: str
    expect: Expectation
    params: dict = field(default_factory=dict)
    needs: str | None = None


DAEMON = """
    import os, signal, sys
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
                signal.signal(sig, signal.SIG_IGN)
            os.closerange(0, 3)
            os.execve("/bin/sleep", ["$token", "600"], $environment)
        os._exit(0)
    os.wait()
"""

TABLE = [
    # reading the host
    Hostile("read /etc/shadow", "print(open('/etc/shadow').read())", raises("FileNotFoundError")),
    Hostile("read the repository", "print(open('$repo/pyproject.toml').read())", raises("FileNotFoundError")),
    Hostile("look for the home directory", "import os; print(os.path.exists('$home'), os.path.exists('/root'))",
            prints("False False")),
    Hostile("list the root directory", """
        import os
        print(sorted(set(os.listdir('/')) - {'usr', 'bin', 'sbin', 'lib', 'lib32', 'lib64', 'libx32', 'etc',
                                             'proc', 'dev', 'tmp'}))
    """, prints("[]")),
    Hostile("see the host's processes", "import os; print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))",
            prints("[1, 2]")),
    Hostile("follow a symlink out", "import os; os.symlink('$repo', '/tmp/out'); print(os.listdir('/tmp/out'))",
            raises("FileNotFoundError")),
    Hostile("reach the cgroup filesystem", "import os; print(os.path.exists('/sys/fs/cgroup'))", prints("False")),
    # writing the host
    Hostile("write outside /tmp", """
        for path in ('/escape', '/usr/escape', '/etc/escape', '/dev/escape', '/proc/sys/kernel/hostname'):
            try:
                open(path, 'w').write('x')
                print('wrote', path)
            except OSError as exc:
                print('refused')
    """, prints(*["refused"] * 5)),
    # the host's network
    Hostile("connect to a host listener on 127.0.0.1",
            "import socket; socket.create_connection(('127.0.0.1', $tcp_port), timeout=2)",
            raises("ConnectionRefusedError")),
    Hostile("send UDP to a host listener on 127.0.0.1", """
        import socket
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'escaped', ('127.0.0.1', $udp_port))
        print('sent')
    """, nothing_reached_the_udp_listener),
    Hostile("connect to a host abstract unix socket", """
        import socket
        socket.socket(socket.AF_UNIX).connect('\\0$unix')
    """, raises("ConnectionRefusedError")),
    Hostile("reach the internet", "import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)",
            raises("OSError: [Errno 101]")),
    # outliving the run
    Hostile("double fork and setsid", Template(DAEMON).safe_substitute(environment="os.environ"),
            ends_at_once_and_nothing_stays),
    Hostile("a daemon without the run's marker", Template(DAEMON).safe_substitute(environment="{}"),
            ends_at_once_and_nothing_stays),
    Hostile("kill the launcher first", """
        import os, signal
        for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGSTOP):
            os.kill(os.getppid(), sig)
        print('still here')
        raise SystemExit(3)
    """, prints("still here", exit_code=3)),
    Hostile("kill(-1) every process it can", """
        import os, signal
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
        print('killed everything it could see')
    """, the_neighbour_survives),
    # tampering with the sandbox's own processes
    Hostile("ptrace the parent", LIBC + "print(libc.ptrace(16, os.getppid(), 0, 0), ctypes.get_errno())",
            prints(f"-1 {errno.EPERM}"), needs=NEEDS_SECCOMP),
    Hostile("PTRACE_TRACEME", LIBC + "print(libc.ptrace(0, 0, 0, 0), ctypes.get_errno())",
            prints(f"-1 {errno.EPERM}"), needs=NEEDS_SECCOMP),
    Hostile("read the parent's memory with process_vm_readv", with_libc("""
        buffer = ctypes.create_string_buffer(8)
        local = (ctypes.c_void_p * 2)(ctypes.addressof(buffer), 8)
        remote = (ctypes.c_void_p * 2)(0x400000, 8)
        print(libc.process_vm_readv(os.getppid(), local, 1, remote, 1, 0), ctypes.get_errno())
    """), prints(f"-1 {errno.EPERM}"), needs=NEEDS_SECCOMP),
    Hostile("open the parent's memory through /proc", "open('/proc/1/mem', 'r+b')", raises("PermissionError")),
    Hostile("read the parent's environment and descriptors", """
        import os
        for path in ('/proc/1/environ', '/proc/1/fd'):
            try:
                os.listdir(path) if path.endswith('fd') else open(path).read()
                print('read', path)
            except PermissionError:
                print('refused')
    """, prints("refused", "refused")),
    Hostile("every denied system call", with_libc(f"""
        table = {{name: numbers[{COLUMN}] for name, numbers in {DENIED_SYSCALLS!r}.items()}}
        allowed = []
        for name, number in table.items():
            if number is not None and (libc.syscall(number, 0, 0, 0, 0, 0, 0) != -1 or ctypes.get_errno() != 1):
                allowed.append(name)
        print(allowed)
    """), prints("[]"), needs=NEEDS_SECCOMP),
    Hostile("an x32 system call", LIBC + "print(libc.syscall(0x40000000 | 39), ctypes.get_errno())",
            prints(f"-1 {errno.EPERM}"), needs="x86_64"),
    Hostile("io_uring", with_libc("""
        params = ctypes.create_string_buffer(120)
        print(libc.syscall(425, 8, params), ctypes.get_errno())  # io_uring_setup: 425 on x86_64 and aarch64
    """), prints(f"-1 {errno.EPERM}"), needs=NEEDS_SECCOMP),
    Hostile("a user namespace", LIBC + "print(libc.unshare(0x10000000), ctypes.get_errno())",
            prints(f"-1 {errno.EPERM}"), needs=NEEDS_SECCOMP),
    Hostile("a keyring", with_libc("""
        add_key = 248 if os.uname().machine == 'x86_64' else 217
        print(libc.syscall(add_key, b'user', b'k', b'v', 1, -4), ctypes.get_errno())  # into the session keyring
    """), prints(f"-1 {errno.EPERM}"), needs=NEEDS_SECCOMP),
    # raising its limits
    Hostile("raise its own limits", """
        import resource
        for name in ('RLIMIT_NPROC', 'RLIMIT_AS', 'RLIMIT_CPU', 'RLIMIT_NOFILE', 'RLIMIT_FSIZE'):
            kind = getattr(resource, name)
            soft, hard = resource.getrlimit(kind)
            try:
                resource.setrlimit(kind, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
                print(name, 'raised')
            except (ValueError, OSError):
                print(name, 'kept', hard != resource.RLIM_INFINITY)
    """, prints(*[f"{name} kept True" for name in ("RLIMIT_NPROC", "RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_NOFILE",
                                                    "RLIMIT_FSIZE")])),
    Hostile("raise the launcher's limits", """
        import resource
        resource.prlimit(1, resource.RLIMIT_NPROC, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    """, raises("PermissionError")),
    Hostile("move its CPU soft limit up to the hard one", """
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
        resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))
        while True:
            pass
    """, limit("cpu"), SLOW_CPU),
    # processes and threads
    Hostile("a fork bomb", """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """, stopped_by_a_limit),
    Hostile("a thread bomb", """
        import threading, time
        while True:
            threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    """, limit("processes")),
    # time
    Hostile("sleep forever", "import time; time.sleep(600)", limit("wall")),
    Hostile("ignore SIGTERM and close its output", """
        import os, signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.closerange(1, 3)
        time.sleep(600)
    """, limit("wall")),
    Hostile("ignore SIGXCPU", """
        import signal
        signal.signal(signal.SIGXCPU, signal.SIG_IGN)
        while True:
            pass
    """, limit("cpu"), SLOW_CPU),
    # output
    Hostile("huge stdout", "while True:\n    print('x' * 1000)", limit("output")),
    Hostile("huge stderr with terminal escapes",
            "import sys\nwhile True:\n    sys.stderr.write('\\x1b[31m' + 'y' * 1000 + '\\n')", truncated_and_escaped),
    Hostile("terminal escapes on stderr", """
        import sys
        sys.stderr.write('\\x1b]0;owned\\x07\\x1b[2J\\r\\x00evil\\n')
        sys.exit(1)
    """, escaped_control_characters),
    # memory, files and /tmp
    Hostile("a 10 GiB bytearray", "bytearray(10 * 1024 ** 3)", limit("memory")),
    Hostile("an 8 GiB mmap", "import mmap; mmap.mmap(-1, 8 << 30)", limit("memory")),
    Hostile("memory across several children", """
        import os, time
        children = []
        for _ in range(4):
            pid = os.fork()
            if pid == 0:
                block = b'x' * (100 * 1024 * 1024)
                time.sleep(1.5)
                os._exit(0)
            children.append(pid)
        held = sum(os.waitpid(pid, 0)[1] == 0 for pid in children)
        print(held, 'of 4 held 100 MiB')
    """, memory_across_children, needs=NEEDS_CGROUP),
    Hostile("fill /tmp", """
        for i in range(100):
            with open(f'/tmp/fill{i}', 'wb') as f:
                f.write(b'x' * (4 << 20))
    """, limit("disk")),
    Hostile("one file past the size limit", "open('/tmp/big', 'wb').write(b'x' * (64 << 20))", limit("file_size")),
    Hostile("many open files", "files = [open('/dev/null') for _ in range(10000)]", limit("open_files")),
]


# --- running the table -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bubblewrap():
    problem = isolation_problem(SandboxParams(**HOSTILE))
    if problem:
        pytest.skip(f"bubblewrap cannot run here: {problem}")


@pytest.fixture(scope="module")
def host(bubblewrap):
    """Listeners on the host's 127.0.0.1 (TCP, UDP) and an abstract unix socket, and a process of the user the
    sandbox runs as (kill(-1) inside must not reach it)."""
    uid = SandboxParams().sandbox_uid if os.geteuid() == 0 else None
    neighbour = subprocess.Popen(["sleep", "300"], user=uid, start_new_session=True)
    name = f"toolstar-test-{uuid.uuid4().hex}"
    with socket.socket() as tcp, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp, \
            socket.socket(socket.AF_UNIX) as unix:
        tcp.bind(("127.0.0.1", 0))
        tcp.listen()
        udp.bind(("127.0.0.1", 0))
        udp.setblocking(False)
        unix.bind("\0" + name)
        unix.listen()
        yield Host(tcp=tcp, udp=udp, unix=unix, unix_name=name, neighbour=neighbour)
    neighbour.kill()
    neighbour.wait()


@pytest.mark.parametrize("hostile", TABLE, ids=[row.name for row in TABLE])
def test_a_hostile_program_is_contained(hostile: Hostile, host: Host):
    if hostile.needs == "x86_64" and MACHINE != "x86_64":
        pytest.skip("x86_64 only")
    if hostile.needs == NEEDS_SECCOMP and MACHINE not in SECCOMP_ARCHES:
        pytest.skip(f"no seccomp syscall table for {MACHINE}")
    if hostile.needs == NEEDS_CGROUP and find_memory_cgroup()[0] is None:
        pytest.skip(f"no memory cgroup per run here: {find_memory_cgroup()[1]}")
    host.token = f"toolstar-daemon-{uuid.uuid4().hex}"
    sandbox = Sandbox(SandboxParams(**{**HOSTILE, **hostile.params}))
    start = time.monotonic()
    result = sandbox.run(host.fill(hostile.code))
    assert time.monotonic() - start < sandbox.params.wall_seconds + 5, "the call outlasted its wall-clock limit"
    hostile.expect(result, host)
    assert leftover_processes() == [], "a process of the sandbox outlived its run"
    assert processes_named(host.token) == [], "a daemon of the program outlived its run"


def test_the_table_is_big_enough():
    assert len(TABLE) >= 30 and len({row.name for row in TABLE}) == len(TABLE)


# --- what the result reports -----------------------------------------------------------------------------------

def test_cpu_time_is_measured_under_bubblewrap(bubblewrap):
    result = Sandbox(SandboxParams(**HOSTILE)).run("sum(i * i for i in range(3_000_000))")
    assert result.ok and result.cpu_seconds > 0.05, result


def rlimit_sandbox() -> Sandbox:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the rlimit mode's warning, tested in test_sandbox.py
        return Sandbox(SandboxParams(isolation="rlimit", **HOSTILE))


def test_the_rlimit_mode_refuses_tracing_too():
    """Without bubblewrap the launcher installs the same seccomp filter, and is not dumpable."""
    result = rlimit_sandbox().run(with_libc("""
        print(libc.ptrace(0, 0, 0, 0), ctypes.get_errno())  # PTRACE_TRACEME
        print(libc.ptrace(16, os.getppid(), 0, 0), ctypes.get_errno())  # PTRACE_ATTACH to the launcher
        open(f'/proc/{os.getppid()}/mem', 'rb')
    """))
    assert result.stdout == f"-1 {errno.EPERM}\n-1 {errno.EPERM}\n", result
    assert result.exception.startswith("PermissionError"), result


def test_the_rlimit_mode_kills_a_daemon_without_the_marker_with_its_cgroup():
    if find_memory_cgroup()[0] is None:
        pytest.skip(f"no memory cgroup per run here: {find_memory_cgroup()[1]}")
    token = f"toolstar-daemon-{uuid.uuid4().hex}"
    code = Template(textwrap.dedent(DAEMON)).safe_substitute(token=token, environment="{}")
    result = rlimit_sandbox().run(code)
    assert result.ok, result
    assert processes_named(token) == [], "a daemon that cleared its environment outlived its run"

