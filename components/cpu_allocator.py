"""Keep freed memory in the process for reuse: the allocator setting that CPU training and generation need.

A training step of the tiny model allocates and frees the same buffers every step (activations, attention outputs,
the logits at the trained positions: a few to a hundred MB each). By default glibc serves every block above its mmap
threshold (which climbs to 32 MB) with a fresh `mmap` and returns it with `munmap` on free, so each step
page-faults and zeroes those pages again, and it trims the heap top back to the kernel when it shrinks. The setting
here keeps the freed blocks below `RETAIN_BELOW` (4 MiB) in the heap for reuse (a fixed threshold, and no trimming)
and maps the larger ones fresh.

Why not keep every block: with mmap off altogether (sessions 17-39) the heap fragments. Steps of different sequence
lengths ask for blocks of different sizes, the holes left behind never fit the next large one, and the heap only
grows: 4.7 GB after 40 tiny SFT steps that need under 2.5 GB, more than 11 GB by step 200 (killed there for memory
beside other jobs), 17.2 GB by the end of a run. Mapping the blocks of 4 MB and more keeps them out of the heap: 2.8
GB at step 40, 4.1 GB at step 200, 6.1 GB over the whole tiny SFT stage. The price is page faults on the mapped
blocks: on one thread SFT steps ran 1.03x and rollouts 0.97x as fast as keeping everything, but the whole stage on two
threads spent a quarter of its CPU time in the kernel (1,335 s against 1,114 s with mmap off in session 39;
benchmarks/bench_cpu_allocator.py, benchmarks/RESULTS.md). The arithmetic is untouched, so the weights a run
produces are bit for bit the same.

Applied on CPU only (a GPU run's host memory is mostly a one-off model load that should go back to the system),
once per process, and only where the C library is glibc (`mallopt` exists); elsewhere it does nothing.

Transparent huge pages for those mapped blocks (`with_huge_pages`, session 42): a mapped block faults in one 4 KiB page
at a time, about 5M faults a minute in the tiny SFT stage. glibc 2.35+ can ask the kernel for 2 MiB pages on the
memory it maps (`madvise(MADV_HUGEPAGE)`, the tunable `glibc.malloc.hugetlb=1`), which cuts the faults about 5x and
the kernel time about 2x. Tunables are read once, when a process starts, so the `star` commands that train or decode
re-execute themselves with it set (`cli.main`); `STAR_HUGE_PAGES=0` turns that off. Same arithmetic, same weights.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
from collections.abc import Mapping
from pathlib import Path

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4
NEVER_TRIM = 2**31 - 1  # the largest value the int parameter takes: 2 GiB of free heap top before trimming
RETAIN_BELOW = 4 * 2**20  # blocks below this stay in the heap when freed; larger ones are mmapped fresh each time


def mallopt_function():
    """glibc's `mallopt(param, value) -> int` through ctypes, or None where there is none (not Linux, not glibc)."""
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt


@functools.cache
def retain_freed_memory() -> bool:
    """Keep freed blocks below `RETAIN_BELOW` in the heap and turn off heap trimming for this process; True when
    applied.

    Idempotent (cached). Returns False off Linux, where the C library has no `mallopt` (musl, macOS), and when glibc
    rejects a setting."""
    mallopt = mallopt_function()
    if mallopt is None:
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, RETAIN_BELOW)) and bool(mallopt(M_TRIM_THRESHOLD, NEVER_TRIM))


HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb=1"  # madvise(MADV_HUGEPAGE) on the memory malloc maps (glibc >= 2.35)
HUGE_PAGES_OPT_OUT = "STAR_HUGE_PAGES"  # "0": never re-execute for it
THP_MODES = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def glibc_version() -> tuple[int, int] | None:
    """(major, minor) of the running glibc, or None where the C library is not glibc."""
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
    except (AttributeError, ValueError, OSError):
        return None
    if name != "glibc":
        return None
    major, minor = (version.split(".") + ["0"])[:2]
    return (int(major), int(minor)) if major.isdigit() and minor.isdigit() else None


def transparent_huge_page_mode(path: Path = THP_MODES) -> str | None:
    """The kernel's transparent huge page mode, the bracketed word of e.g. "always [madvise] never"; None if unknown."""
    try:
        text = path.read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None


def with_huge_pages(environ: Mapping[str, str], glibc: tuple[int, int] | None, thp_mode: str | None) -> dict | None:
    """The environment to re-execute with so that malloc asks for huge pages, or None when there is nothing to do:
    not glibc 2.35+, the kernel's huge pages off ("never") or unknown, the tunable already set (also the guard that
    stops a second re-execution), or `STAR_HUGE_PAGES=0`. Other tunables the user set are kept."""
    if glibc is None or glibc < (2, 35) or thp_mode not in ("always", "madvise"):
        return None
    if environ.get(HUGE_PAGES_OPT_OUT, "1") == "0":
        return None
    tunables = environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb" in tunables:
        return None
    return {**environ, "GLIBC_TUNABLES": f"{tunables}:{HUGE_PAGES_TUNABLE}" if tunables else HUGE_PAGES_TUNABLE}


def reexec_with_huge_pages() -> None:
    """Replace this process with itself (same interpreter, arguments and PID) under `with_huge_pages`'s environment;
    returns without doing anything where that is None. Call it before any work (nothing is carried over)."""
    environ = with_huge_pages(os.environ, glibc_version(), transparent_huge_page_mode())
    if environ is None or not getattr(sys, "orig_argv", None):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], environ)
