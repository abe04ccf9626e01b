"""Keep freed memory in the process for reuse: the allocator setting that CPU training and generation need.

A training step of the tiny model allocates and frees the same large buffers every step (activations, the logits
at the trained positions, attention outputs: tens of MB each). glibc serves every block above its mmap threshold
(32 MB at most) with a fresh `mmap` and returns it with `munmap` on free, so each step page-faults and zeroes
those pages again, and trims the heap top back to the kernel when it shrinks. On a 2-core machine that costs about
15% of an SFT step (benchmarks/cpu_allocator.py). With mmap off and trimming disabled the freed blocks stay in the
heap and the next step reuses them. The arithmetic is untouched, so the weights a run produces are bit for bit
the same; only the resident memory stays at the process's peak instead of falling between steps.

Applied on CPU only (a GPU run's host memory is mostly a one-off model load that should go back to the system),
once per process, and only where the C library is glibc (`mallopt` exists); elsewhere it does nothing.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_MAX = -4
NEVER_TRIM = 2**31 - 1  # the largest value the int parameter takes: 2 GiB of free heap top before trimming


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
    """Turn off glibc's mmap for large blocks and heap trimming for this process; True when applied.

    Idempotent (cached). Returns False off Linux, where the C library has no `mallopt` (musl, macOS), and when glibc
    rejects a setting."""
    mallopt = mallopt_function()
    if mallopt is None:
        return False
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, NEVER_TRIM))
