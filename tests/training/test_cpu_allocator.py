"""`retain_freed_memory`: freed blocks below `RETAIN_BELOW` stay in the process for the next step; the largest go back.

Keeping every block (mmap off) fragmented the heap of a whole SFT run to 17 GB; blocks of `RETAIN_BELOW` and more
are mapped fresh, so they never enter the heap."""
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
