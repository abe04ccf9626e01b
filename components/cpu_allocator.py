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
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

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
