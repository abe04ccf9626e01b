"""The Python sandbox against hostile programs: each ends as an error result within its limits, with the reason,
and the host is intact afterwards (no process of the sandbox left, no file written outside it).

Every test runs under bubblewrap (skipped, with the reason, where bwrap cannot run) and, where the limit is
meaningful without namespaces, under the rlimit-only mode. Isolation tests (network, files) need bubblewrap.
"""
from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import signal
import socket
import stat
import struct
import tempfile
import textwrap
import time
import uuid
import warnings
from pathlib import Path

import pytest

from components.params import ParamsError, parse_section
from components.toolstar import sandbox as sandbox_module
from components.toolstar.protocol import PythonCall, parse_turn, python_observation
from components.toolstar.sandbox import (
    Sandbox,
    SandboxParams,
    SandboxUnavailable,
    isolation_problem,
    leftover_processes,
)

REPO = Path(__file__).resolve().parents[2]
QUICK = {"cpu_seconds": 1, "wall_seconds": 3}  # short limits keep the hostile suite quick
BOUND = 30.0  # every run, however hostile, must end well within this


def _sandbox(isolation: str) -> Sandbox:
    params = SandboxParams(isolation=isolation, **QUICK)
    if isolation == "bubblewrap":
        problem = isolation_problem(params)
        if problem:
            pytest.skip(f"bubblewrap cannot run here: {problem}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return Sandbox(params)


@pytest.fixture(scope="module", params=["bubblewrap", "rlimit"])
def sandbox(request) -> Sandbox:
    return _sandbox(request.param)


@pytest.fixture(scope="module")
def isolated() -> Sandbox:
    return _sandbox("bubblewrap")


@pytest.fixture(autouse=True)
def host_is_left_clean():
    yield
    end = time.monotonic() + 2
    while leftover_processes() and time.monotonic() < end:
        time.sleep(0.05)
    assert leftover_processes() == [], "a process of the sandbox outlived its run"


def run(sandbox: Sandbox, code: str):
    start = time.monotonic()
    result = sandbox.run(textwrap.dedent(code))
    assert time.monotonic() - start < BOUND and result.seconds < BOUND
    return result


# --- the normal cases ------------------------------------------------------------------------------------------

def test_a_normal_program(sandbox):
    result = run(sandbox, "print(2 + 2)")
    assert result.ok and result.stdout == "4\n" and result.exit_code == 0
    assert result.limit is None and result.signal is None and not result.truncated and result.error is None


def test_an_exception_is_an_error_with_its_traceback(sandbox):
    result = run(sandbox, "x = 1\nprint('before')\nx / 0")
    assert not result.ok and result.exit_code == 1 and result.stdout == "before\n"
    assert result.exception == "ZeroDivisionError: division by zero"
    assert result.error == "the program exited with status 1"


def test_a_turn_runs_end_to_end(sandbox):
    action = parse_turn("<think> 10 choose 3 </think><python>\n```python\nimport math\nprint(math.comb(10, 3))\n```\n"
                        "</python>")
    assert isinstance(action, PythonCall)
    assert python_observation(run(sandbox, action.code)) == "120"


def test_the_host_environment_is_not_passed_in(sandbox, monkeypatch):
    monkeypatch.setenv("TOOLSTAR_TEST_SECRET", "hunter2")
    result = run(sandbox, "import os; print(os.environ.get('TOOLSTAR_TEST_SECRET'), os.getuid() != 0)")
    assert result.stdout == "None True\n"


# --- hostile programs ------------------------------------------------------------------------------------------

def test_sys_exit_3(sandbox):
    result = run(sandbox, "import sys; sys.exit(3)")
    assert not result.ok and result.exit_code == 3 and result.limit is None
    assert result.error == "the program exited with status 3"


def test_a_segfault(sandbox):
    result = run(sandbox, "import ctypes; ctypes.string_at(0)")
    assert not result.ok and result.signal == 11 and result.exit_code is None
    assert result.error == "the program was killed by SIGSEGV"


def test_an_infinite_loop_is_stopped(sandbox):
    result = run(sandbox, "while True:\n    pass")
    assert not result.ok and result.limit in ("cpu", "wall")  # cpu unless the machine is too busy to give it 1 s


def test_a_sleeper_is_stopped_at_the_wall_clock_limit(sandbox):
    result = run(sandbox, "import time; print('start', flush=True); time.sleep(600)")
    assert result.limit == "wall" and result.error == "the program was stopped after the 3 s time limit"
    assert result.stdout == "start\n"  # what it printed before is kept
    assert 3 <= result.seconds < 10


def test_a_10_gb_allocation(sandbox):
    result = run(sandbox, "x = bytearray(10 * 1024 ** 3)")
    assert not result.ok and result.limit == "memory" and result.exception == "MemoryError"


def test_huge_output_is_truncated_and_stopped(sandbox):
    result = run(sandbox, "while True:\n    print('x' * 1000)")
    cap = sandbox.params.max_output_bytes
    assert result.limit == "output" and result.truncated and "truncated" in result.error
    assert len(result.stdout.encode()) + len(result.stderr.encode()) <= cap


def test_a_child_left_behind_does_not_outlive_the_run(sandbox):
    result = run(sandbox, "import subprocess; subprocess.Popen(['sleep', '600']); print('left it')")
    assert result.stdout == "left it\n" and result.seconds < 3  # the autouse fixture checks that it is gone


def test_the_process_count_is_limited(sandbox):
    result = run(sandbox, """
        import os, time
        started = 0
        for _ in range(100):
            try:
                pid = os.fork()
            except OSError:
                break
            if pid == 0:
                time.sleep(600)
                os._exit(0)
            started += 1
        print(started)
    """)
    assert result.ok and 0 <= int(result.stdout) < sandbox.params.max_processes


def test_a_fork_bomb(sandbox):
    result = run(sandbox, """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """)
    assert not result.ok and result.limit in ("wall", "cpu", "processes")


# --- isolation (bubblewrap only) -------------------------------------------------------------------------------

def test_no_network(isolated):
    result = run(isolated, "import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)")
    assert not result.ok and "Network is unreachable" in result.exception


def test_no_host_loopback_either():
    """A server on the host's 127.0.0.1 (MLflow, a retriever) is out of reach: the sandbox has its own loopback."""
    isolated = _sandbox("bubblewrap")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        result = run(isolated, f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)")
    assert not result.ok and "ConnectionRefusedError" in result.exception


def test_the_project_and_home_are_invisible(isolated):
    result = run(isolated, f"""
        import os
        print(os.path.exists({str(REPO)!r}), os.path.exists({os.path.expanduser('~')!r}))
        open({str(REPO / 'pyproject.toml')!r}).read()
    """)
    assert result.stdout == "False False\n"
    assert not result.ok and result.exception.startswith("FileNotFoundError")


def test_nothing_is_written_outside_the_private_tmp(isolated):
    name = f"toolstar-escape-{uuid.uuid4().hex}"
    project, host_tmp = REPO / name, Path(tempfile.gettempdir()) / name
    inside_only = [Path(d) / name for d in ("/", "/dev", "/dev/shm", "/etc", "/usr")]
    result = run(isolated, f"""
        for path in {[str(p) for p in [project, *inside_only, host_tmp]]!r}:
            try:
                with open(path, "w") as f:
                    f.write("escaped")
                print("wrote", path)
            except OSError as exc:
                print("refused", exc.strerror)
    """)
    assert result.stdout.splitlines() == [
        "refused No such file or directory",  # the project is not there at all
        *["refused Read-only file system"] * len(inside_only),  # the system, / and /dev are read-only
        f"wrote {host_tmp}",  # its own /tmp works...
    ]
    assert not project.exists() and not host_tmp.exists()  # ...and none of it reached the host


def test_the_private_tmp_is_size_limited(isolated):
    result = run(isolated, "open('/tmp/big', 'wb').write(b'x' * (200 * 1024 * 1024))")
    assert not result.ok and result.exception == "OSError: [Errno 27] File too large"  # 64 MiB per file


# --- refusing to run without isolation -------------------------------------------------------------------------

def test_without_bubblewrap_it_refuses_and_says_how_to_install_it(monkeypatch):
    real_which = shutil.which
    monkeypatch.setattr(sandbox_module.shutil, "which",
                        lambda name, path=None: None if name == "bwrap" else real_which(name, path=path))
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap") as error:
        Sandbox(SandboxParams())
    assert "isolation: rlimit" in str(error.value)


@pytest.fixture
def broken_bwrap():
    """A `bwrap` that fails the way it does where user namespaces are forbidden (in a directory any user can read,
    since the sandbox drops root)."""
    directory = tempfile.mkdtemp(prefix="toolstar-fake-bwrap-")
    os.chmod(directory, 0o755)
    fake = Path(directory) / "bwrap"
    fake.write_text("#!/bin/sh\ncase \"$1\" in --help) exit 0;; esac\n"
                    "echo 'bwrap: No permissions to creating new namespace, likely because the kernel does not allow "
                    "non-privileged user namespaces.' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH | stat.S_IRGRP | stat.S_IROTH)
    yield str(fake)
    shutil.rmtree(directory)


def test_when_bubblewrap_cannot_create_namespaces_it_refuses_and_says_why(monkeypatch, broken_bwrap):
    real_which = shutil.which
    monkeypatch.setattr(sandbox_module.shutil, "which",
                        lambda name, path=None: broken_bwrap if name == "bwrap" else real_which(name, path=path))
    message = isolation_problem(SandboxParams())
    assert message and "No permissions to creating new namespace" in message
    assert "user namespaces" in message and "isolation: rlimit" in message


def test_the_rlimit_mode_is_an_opt_in_that_warns_once(monkeypatch):
    monkeypatch.setattr(sandbox_module, "_rlimit_warned", False)
    with pytest.warns(RuntimeWarning, match="apt-get install bubblewrap"):
        Sandbox(SandboxParams(isolation="rlimit"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Sandbox(SandboxParams(isolation="rlimit"))


# --- params ----------------------------------------------------------------------------------------------------

def test_params_defaults_and_errors():
    params = parse_section({"sandbox": None}, "sandbox", SandboxParams)
    assert (params.isolation, params.cpu_seconds, params.memory_mib, params.max_processes, params.max_output_bytes,
            params.wall_seconds) == ("bubblewrap", 5, 512, 16, 65536, 10.0)
    for bad in ({"isolation": "none"}, {"wall_seconds": 0}, {"library_dirs": ["site-packages"]}, {"cpu": 5}):
        with pytest.raises(ParamsError, match="sandbox"):
            parse_section({"sandbox": bad}, "sandbox", SandboxParams)


# --- the seccomp filter, the memory cgroup, what reaches the model ---------------------------------------------

ALLOW, EPERM = 0x7FFF0000, 0x00050000 | errno.EPERM
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7, "i386": 0x40000003}


def run_filter(program: bytes, number: int, arch: int) -> int:
    """What the kernel's seccomp would answer for system call `number` made through ABI `arch` (a minimal cBPF
    interpreter for the instructions the filter uses)."""
    data = struct.pack("=iI", number, arch) + bytes(56)  # struct seccomp_data: nr, arch, then ip and args
    instructions = [struct.unpack_from("=HBBI", program, at) for at in range(0, len(program), 8)]
    pc, accumulator = 0, 0
    while True:
        code, jump_true, jump_false, k = instructions[pc]
        if code == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            accumulator, pc = struct.unpack_from("=I", data, k)[0], pc + 1
        elif code in (0x15, 0x35):  # BPF_JMP | BPF_JEQ / BPF_JGE, against k
            taken = accumulator == k if code == 0x15 else accumulator >= k
            pc += 1 + (jump_true if taken else jump_false)
        elif code == 0x06:  # BPF_RET | BPF_K
            return k
        else:
            raise AssertionError(f"unexpected BPF instruction {code:#x}")


@pytest.mark.parametrize("machine, column, allowed", [
    ("x86_64", 0, {"read": 0, "write": 1, "getpid": 39, "clone": 56, "fork": 57, "execve": 59, "exit_group": 231,
                   "wait4": 61, "mmap": 9, "clone3": 435, "setrlimit": 160}),
    ("aarch64", 1, {"read": 63, "write": 64, "getpid": 172, "clone": 220, "execve": 221, "exit_group": 94,
                    "wait4": 260, "mmap": 222, "clone3": 435, "setrlimit": 164}),
])
def test_the_seccomp_filter_refuses_exactly_the_denied_calls(machine, column, allowed):
    program = sandbox_module.seccomp_filter(machine)
    arch = AUDIT_ARCH[machine]
    for name, numbers in sandbox_module.DENIED_SYSCALLS.items():
        if numbers[column] is not None:
            assert run_filter(program, numbers[column], arch) == EPERM, name
    for name, number in allowed.items():
        assert run_filter(program, number, arch) == ALLOW, name
    assert run_filter(program, 26, AUDIT_ARCH["i386"]) == EPERM  # i386's ptrace, through int 0x80
    if machine == "x86_64":
        assert run_filter(program, 0x40000000 | 39, arch) == EPERM  # the x32 ABI
    assert sandbox_module.seccomp_filter("riscv64") is None


@pytest.mark.parametrize("header, column", [("/usr/include/x86_64-linux-gnu/asm/unistd_64.h", 0),
                                            ("/usr/include/asm-generic/unistd.h", 1)])
def test_the_syscall_table_matches_the_kernel_headers(header, column):
    """The numbers in DENIED_SYSCALLS are the kernel's (x86_64's own table; aarch64 uses the generic one)."""
    if not os.path.exists(header):
        pytest.skip(f"{header} is not installed (linux-libc-dev)")
    numbers = dict(re.findall(r"#define __NR(?:3264)?_(\w+)\s+(\d+)", Path(header).read_text()))
    for name, row in sandbox_module.DENIED_SYSCALLS.items():
        if row[column] is not None:
            assert int(numbers[name]) == row[column], name


HYBRID_CGROUPS = "4:memory:/agents/a1\n1:cpu:/\n0::/\n"
HYBRID_MOUNTS = ("31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
                 "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
                 "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory\n"
                 "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n")


def test_memory_cgroups_are_looked_for_in_v2_then_in_v1s_memory_hierarchy():
    assert sandbox_module.memory_cgroup_candidates(HYBRID_CGROUPS, HYBRID_MOUNTS) == [
        sandbox_module.MemoryCgroup("/sys/fs/cgroup/unified", 2),
        sandbox_module.MemoryCgroup("/sys/fs/cgroup/memory/agents/a1", 1)]
    unified = "25 1 0:22 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    assert sandbox_module.memory_cgroup_candidates("0::/user.slice/user-1000.slice/session-2.scope\n", unified) == [
        sandbox_module.MemoryCgroup("/sys/fs/cgroup/user.slice/user-1000.slice/session-2.scope", 2)]
    assert sandbox_module.memory_cgroup_candidates("1:cpu:/\n", HYBRID_MOUNTS.splitlines()[1]) == []


def test_without_a_memory_cgroup_it_says_so_once_with_the_worst_case(monkeypatch, caplog):
    reason = "cgroup v2 at /sys/fs/cgroup/unified does not give the memory controller to its children"
    monkeypatch.setattr(sandbox_module, "find_memory_cgroup", lambda: (None, reason))
    monkeypatch.setattr(sandbox_module, "_cgroup_fallback_logged", False)
    params = SandboxParams(isolation="rlimit", memory_mib=256, max_processes=8, **QUICK)
    with caplog.at_level(logging.WARNING, logger=sandbox_module.__name__), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        sandboxes = [Sandbox(params), Sandbox(params)]
    said = [record.getMessage() for record in caplog.records if "no memory cgroup" in record.getMessage()]
    assert len(said) == 1 and reason in said[0] and "= 2048 MiB" in said[0]
    assert sandboxes[0].cgroup is None and run(sandboxes[0], "print('runs without one')").ok  # a clean fallback


def test_control_characters_are_escaped_newlines_and_tabs_kept():
    assert sandbox_module.printable(b"a\tb\n\x1b[31mred\x07\r\x00\x7f \xc2\x9b caf\xc3\xa9 \xff") == (
        "a\tb\n\\x1b[31mred\\x07\\x0d\\x00\\x7f \\x9b caf\u00e9 \ufffd")


def test_too_many_files_and_an_impossible_mmap_name_their_limits(sandbox):
    result = run(sandbox, "open('/dev/null').close()\nfiles = [open('/dev/null') for _ in range(10000)]")
    assert result.limit == "open_files" and result.error == "the program could not open more files (limit 64 open " \
                                                            "at once)"
    result = run(sandbox, "import mmap; mmap.mmap(-1, 64 << 30)")
    assert result.limit == "memory" and result.exception == "OSError: [Errno 12] Cannot allocate memory"


def test_a_program_that_ignores_sigxcpu_is_stopped_by_the_cpu_limit(sandbox):
    result = sandbox.run("import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass")
    assert result.signal == signal.SIGKILL and result.limit in ("cpu", "wall"), result  # wall: a very busy host
    assert result.limit == "wall" or (result.error == "the program was stopped after 1 s of CPU time"
                                      and result.cpu_seconds >= 1.9)
