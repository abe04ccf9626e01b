"""`retain_freed_memory`: freed large blocks stay in the process for the next step instead of going back to the kernel."""
import subprocess
import sys
import textwrap

import pytest

from components.cpu_allocator import mallopt_function, retain_freed_memory

needs_glibc = pytest.mark.skipif(mallopt_function() is None, reason="needs glibc's mallopt (Linux with glibc)")

# A child process allocates and frees a 256 MiB block, touching every page, and prints its resident MiB with the
# block alive and after the free. Run in a child: the setting is process-wide and cannot be taken back cleanly.
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
    size = 256 * 2**20
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    alive = resident()
    libc.free(block)
    print(alive, resident())
""")


def resident_alive_and_freed(mode: str) -> tuple[int, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True).stdout
    alive, freed = out.split()
    return int(alive), int(freed)


@needs_glibc
def test_glibc_returns_a_freed_large_block_but_retained_memory_keeps_it_for_reuse():
    alive, freed = resident_alive_and_freed("default")
    assert alive - freed > 200  # glibc's default: the block was an mmap, unmapped on free

    alive, freed = resident_alive_and_freed("retain")
    assert alive - freed < 16  # kept in the heap for the next allocation


@needs_glibc
def test_retain_freed_memory_is_applied_once_per_process():
    assert retain_freed_memory() is True
    assert retain_freed_memory() is True
    assert retain_freed_memory.cache_info().hits >= 1
