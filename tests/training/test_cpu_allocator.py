"""`retain_freed_memory`: freed blocks below `RETAIN_BELOW` stay in the process for the next step; the largest go back.

Keeping every block (mmap off) fragmented the heap of a whole SFT run to 17 GB; blocks of `RETAIN_BELOW` and more
are mapped fresh, so they never enter the heap."""
import os
import subprocess
import sys
import textwrap

import pytest

from components.cpu_allocator import RETAIN_BELOW, mallopt_function, retain_freed_memory

needs_glibc = pytest.mark.skipif(mallopt_function() is None, reason="needs glibc's mallopt (Linux with glibc)")

# A child process allocates argv[3] blocks of argv[2] MiB each, touching every page, frees them, and prints its
# resident MiB with the blocks alive and after the free. Run in a child: the setting is process-wide and cannot be
# taken back cleanly.
PROBE = textwrap.dedent("""
    import ctypes, sys
    from pathlib import Path
    from components.cpu_allocator import retain_freed_memory

    def resident():
        line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmRSS:"))
        return int(line.split()[1]) // 1024

    if sys.argv[1] == "retain":
        assert retain_freed_memory()
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size = int(sys.argv[2]) * 2**20
    blocks = [libc.malloc(size) for _ in range(int(sys.argv[3]))]
    for block in blocks:
        ctypes.memset(block, 1, size)
    alive = resident()
    for block in blocks:
        libc.free(block)
    print(alive, resident())
""")


def resident_alive_and_freed(mode: str, mib: int, count: int = 1) -> tuple[int, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode, str(mib), str(count)], capture_output=True, text=True,
                         check=True).stdout
    alive, freed = out.split()
    return int(alive), int(freed)


@needs_glibc
def test_glibc_returns_freed_3_mib_blocks_but_retained_memory_keeps_them_for_reuse():
    assert 3 * 2**20 < RETAIN_BELOW
    alive, freed = resident_alive_and_freed("default", 3, count=32)
    assert alive - freed > 80  # glibc's default: each block was an mmap, unmapped on free

    alive, freed = resident_alive_and_freed("retain", 3, count=32)
    assert alive - freed < 8  # kept in the heap for the next allocations


@needs_glibc
def test_a_freed_block_above_the_threshold_goes_back_so_it_cannot_fragment_the_heap():
    assert 256 * 2**20 > RETAIN_BELOW
    alive, freed = resident_alive_and_freed("retain", 256)
    assert alive - freed > 200


@needs_glibc
def test_retain_freed_memory_is_applied_once_per_process():
    assert retain_freed_memory() is True
    assert retain_freed_memory() is True
    assert retain_freed_memory.cache_info().hits >= 1


# --- huge pages for the blocks malloc maps (session 42) ---------------------------------------------------------

from components.cpu_allocator import (HUGE_PAGES_TUNABLE, glibc_version, transparent_huge_page_mode,  # noqa: E402
                                      with_huge_pages)

GLIBC = (2, 36)


def test_the_huge_page_tunable_is_added_once_and_keeps_the_users_own_tunables():
    assert with_huge_pages({"PATH": "/bin"}, GLIBC, "madvise") == {"PATH": "/bin", "GLIBC_TUNABLES": HUGE_PAGES_TUNABLE}
    mine = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
    assert with_huge_pages(mine, GLIBC, "always")["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:" + HUGE_PAGES_TUNABLE
    # already set (by the user, or by the first execution): nothing to do, so a process re-executes at most once
    assert with_huge_pages({"GLIBC_TUNABLES": HUGE_PAGES_TUNABLE}, GLIBC, "madvise") is None
    assert with_huge_pages({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, GLIBC, "madvise") is None


def test_no_huge_pages_without_glibc_235_or_kernel_support_or_when_opted_out():
    assert with_huge_pages({}, None, "madvise") is None  # musl, macOS
    assert with_huge_pages({}, (2, 34), "madvise") is None  # the tunable is new in glibc 2.35
    assert with_huge_pages({}, GLIBC, "never") is None
    assert with_huge_pages({}, GLIBC, None) is None  # no /sys/kernel/mm/transparent_hugepage
    assert with_huge_pages({"STAR_HUGE_PAGES": "0"}, GLIBC, "madvise") is None


def test_the_kernels_mode_is_the_bracketed_word(tmp_path):
    modes = tmp_path / "enabled"
    modes.write_text("always [madvise] never\n")
    assert transparent_huge_page_mode(modes) == "madvise"
    modes.write_text("[always] madvise never\n")
    assert transparent_huge_page_mode(modes) == "always"
    assert transparent_huge_page_mode(tmp_path / "missing") is None


supports_huge_pages = pytest.mark.skipif(
    with_huge_pages({}, glibc_version(), transparent_huge_page_mode()) is None,
    reason="needs glibc >= 2.35 and transparent huge pages (always or madvise)")

# Prints the tunables it started with, maps a 64 MiB block through malloc and touches it, and prints how much of the
# process's anonymous memory is in huge pages.
HUGE_PROBE = textwrap.dedent("""
    import ctypes, os
    from pathlib import Path
    print("started with", os.environ.get("GLIBC_TUNABLES"), flush=True)
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    block = libc.malloc(64 * 2**20)
    ctypes.memset(block, 1, 64 * 2**20)
    rollup = Path("/proc/self/smaps_rollup").read_text().splitlines()
    print("huge kB", next(int(l.split()[1]) for l in rollup if l.startswith("AnonHugePages:")))
""")


@supports_huge_pages
def test_a_model_command_re_executes_once_with_huge_pages_for_the_blocks_malloc_maps(tmp_path):
    """`star copy-probe` (a model command) restarts itself with the tunable, then fails as usual on a missing model."""
    entry = "import sys; from components.cli import main; sys.exit(main())"
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "STAR_HUGE_PAGES")}
    done = subprocess.run([sys.executable, "-c", f"print('start', flush=True); {entry}", "copy-probe", "--model",
                           str(tmp_path / "missing")], capture_output=True, text=True, env=env)
    assert done.stdout.split() == ["start", "start"]  # the second start is the re-executed process
    assert done.returncode == 2 and "is not a checkpoint directory" in done.stderr

    plain = subprocess.run([sys.executable, "-c", HUGE_PROBE], capture_output=True, text=True, env=env, check=True)
    tuned = subprocess.run([sys.executable, "-c", HUGE_PROBE], capture_output=True, text=True, check=True,
                           env={**env, "GLIBC_TUNABLES": HUGE_PAGES_TUNABLE})
    assert tuned.stdout.splitlines()[0] == f"started with {HUGE_PAGES_TUNABLE}"
    huge_kb = int(tuned.stdout.split()[-1])
    assert huge_kb >= 32 * 1024  # most of the 64 MiB block came in 2 MiB pages
    if transparent_huge_page_mode() == "madvise":
        assert int(plain.stdout.split()[-1]) < huge_kb // 4  # without the tunable nothing asked for them


def test_only_model_commands_re_execute(monkeypatch, tmp_path):
    import components.cli as cli
    import components.cpu_allocator as allocator

    class ReExecuted(Exception):
        pass

    def reexec():
        raise ReExecuted

    monkeypatch.setattr(allocator, "reexec_with_huge_pages", reexec)
    missing = str(tmp_path / "missing")
    monkeypatch.setattr(sys, "argv", ["star", "copy-probe", "--model", missing])
    with pytest.raises(ReExecuted):
        cli.main()  # argv from the command line: a process entry
    monkeypatch.setattr(sys, "argv", ["star", "preset", "list"])
    assert cli.main() == 0  # not a model command
