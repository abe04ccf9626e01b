"""Benchmark the CPU SFT loop with glibc's default large-block handling against `retain_freed_memory`, side by side.

One process trains two copies of one model on the same SFT examples in alternating blocks of optimiser steps:
"glibc" blocks run with glibc's steady-state defaults (blocks above 32 MB come from a fresh mmap and are unmapped
on free; the heap top is trimmed above 64 MB free: what its dynamic threshold settles at), "retained" blocks with
`components.cpu_allocator`'s setting (no mmap, no trimming: freed blocks are reused). Alternating puts a change of
the machine's load on both. It prints each one's tokens per second, the ratio, the resident memory after each kind
of block, and checks that both copies end with identical weights (the setting must not change the arithmetic).

    python benchmarks/bench_cpu_allocator.py --data data/sft --model models/base   # a built pipeline's data/base
    python benchmarks/bench_cpu_allocator.py                                        # self-contained: expert data
"""
from __future__ import annotations

import argparse
import copy
import platform
import time
from pathlib import Path

import torch
from bench_sft_autocast import from_disk, self_contained

from components.cpu_allocator import M_MMAP_MAX, M_TRIM_THRESHOLD, NEVER_TRIM, mallopt_function
from components.training.sft import SFTParams, build_examples, cpu_has_native_bf16, train_torch

M_MMAP_THRESHOLD = -3
GLIBC_STEADY = {M_MMAP_MAX: 65536, M_MMAP_THRESHOLD: 32 * 2**20, M_TRIM_THRESHOLD: 64 * 2**20}
RETAINED = {M_MMAP_MAX: 0, M_TRIM_THRESHOLD: NEVER_TRIM}


def resident_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, help="an sft_data output folder (train.jsonl)")
    parser.add_argument("--model", type=Path, help="a base checkpoint folder (with --data)")
    parser.add_argument("--queries", type=int, default=120, help="expert trajectories without --data")
    parser.add_argument("--steps", type=int, default=6, help="optimiser steps per block")
    parser.add_argument("--rounds", type=int, default=4, help="alternating glibc/retained blocks of each")
    args = parser.parse_args()
    mallopt = mallopt_function()
    if mallopt is None:
        raise SystemExit("this benchmark needs glibc's mallopt (Linux with glibc)")

    tokenizer, model, records = from_disk(args.data, args.model) if args.data else self_contained(args.queries)
    examples, _ = build_examples(tokenizer, records, cutoff_len=8192)
    dtype = "bfloat16" if cpu_has_native_bf16() else "float32"
    settings = {"glibc": GLIBC_STEADY, "retained": RETAINED}
    models = {name: copy.deepcopy(model) for name in settings}
    totals = {name: [0, 0.0] for name in settings}
    resident = {name: 0.0 for name in settings}
    for round_ in range(args.rounds):
        for name, m in models.items():
            for param, value in settings[name].items():
                if not mallopt(param, value):
                    raise SystemExit(f"mallopt({param}, {value}) was rejected")
            params = SFTParams(epochs=100, max_steps=args.steps, batch_size=4, micro_batch_size=4,
                               learning_rate=2e-3, eval_every=10**6, backend="torch", dtype=dtype, seed=round_)
            started = time.perf_counter()
            result = train_torch(m, tokenizer, examples, [], params, progress=False)
            if round_:  # the first round warms both up (first-touch page faults, lazy initialisation)
                totals[name][0] += result.summary["tokens"]
                totals[name][1] += time.perf_counter() - started
            resident[name] = resident_mib()
    speed = {name: tokens / seconds for name, (tokens, seconds) in totals.items()}
    same = all(torch.equal(a, b) for a, b in zip(models["glibc"].parameters(), models["retained"].parameters()))
    print(f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
          f"torch {torch.__version__}, compute {dtype}")
    print(f"{len(examples)} examples, {args.rounds - 1} timed rounds (+1 warm-up) x {args.steps} steps of 4 sequences")
    for name, value in speed.items():
        print(f"{name:9s} {value:8.0f} tokens/s   resident after its last block {resident[name]:7.0f} MiB")
    print(f"retained / glibc: {speed['retained'] / speed['glibc']:.2f}x; identical weights: {same}")


if __name__ == "__main__":
    main()
