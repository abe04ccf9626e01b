"""Benchmark the CPU SFT loop under glibc allocator settings: speed side by side, peak memory one process each.

Speed: one process trains one copy of the model per setting on the same SFT examples, in alternating blocks of
optimiser steps, switching glibc's `mallopt` settings before each block, so a change of the machine's load falls
on every setting (`retain_freed_memory` runs once first; it is cached, so the loop's calls change nothing).
Memory: the heap a setting builds is what it costs, and settings sharing a process share a heap, so with
`--memory-steps N` every setting also trains N steps in a fresh process of its own and reports that process's peak
resident set (VmHWM). All copies must end with identical weights: the settings change no arithmetic.
Rollouts (`--rollouts CHECKPOINT`): one RL step's sampled episodes (4 queries x 4 at temperature 0.6, seeded, so
every setting decodes the same tokens) under each setting in turn, for `--rounds` rounds; decoding allocates a
fresh key/value cache buffer every round of 32 tokens, tens of MB at batch 16.

Settings (glibc's parameter names):
  glibc          its steady-state defaults: blocks above 32 MB mmapped and unmapped on free, heap trimmed above 64 MB
  retained       no mmap, no trimming: every freed block stays for reuse (`retain_freed_memory` until session 40)
  retained<32MB  blocks of 32 MB and more mmapped, the rest retained, no trimming
  retained<16MB  the same at 16 MB
  retained<8MB   the same at 8 MB
  retained<4MB   blocks of 4 MB and more mmapped, the rest retained, no trimming (`retain_freed_memory` now)

    python benchmarks/bench_cpu_allocator.py --data data/sft --model models/base --memory-steps 120
    python benchmarks/bench_cpu_allocator.py --steps 0 --rollouts models/sft   # rollouts only (after dvc repro sft)
    python benchmarks/bench_cpu_allocator.py --queries 60                     # self-contained: expert data
    python benchmarks/bench_cpu_allocator.py --steps 0 --huge-pages-steps 15 --rounds 2 \
        --data data/sft --model models/base

Huge pages (`--huge-pages-steps N`, session 42): the shipped setting (retained<4MB) trains N steps in fresh processes,
alternately without and with glibc's `glibc.malloc.hugetlb=1` tunable (transparent huge pages for the blocks malloc
maps; a tunable is read when a process starts, so this cannot share a process), `--rounds` times each, and reports
the seconds, the kernel (system) time and the minor page faults of each process, and whether the weights are equal.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch
from bench_sft_autocast import add_data_arguments, from_disk, self_contained

from components.cpu_allocator import (HUGE_PAGES_OPT_OUT, HUGE_PAGES_TUNABLE, M_MMAP_MAX, M_MMAP_THRESHOLD,
                                      M_TRIM_THRESHOLD, NEVER_TRIM, glibc_version, mallopt_function,
                                      retain_freed_memory, transparent_huge_page_mode)
from components.training.sft import SFTParams, build_examples, cpu_has_native_bf16, train_torch

MIB = 2**20
SETTINGS = {
    "glibc": {M_MMAP_MAX: 65536, M_MMAP_THRESHOLD: 32 * MIB, M_TRIM_THRESHOLD: 64 * MIB},
    "retained": {M_MMAP_MAX: 0, M_TRIM_THRESHOLD: NEVER_TRIM},
    "retained<32MB": {M_MMAP_MAX: 65536, M_MMAP_THRESHOLD: 32 * MIB, M_TRIM_THRESHOLD: NEVER_TRIM},
    "retained<16MB": {M_MMAP_MAX: 65536, M_MMAP_THRESHOLD: 16 * MIB, M_TRIM_THRESHOLD: NEVER_TRIM},
    "retained<8MB": {M_MMAP_MAX: 65536, M_MMAP_THRESHOLD: 8 * MIB, M_TRIM_THRESHOLD: NEVER_TRIM},
    "retained<4MB": {M_MMAP_MAX: 65536, M_MMAP_THRESHOLD: 4 * MIB, M_TRIM_THRESHOLD: NEVER_TRIM},
}


def apply(setting: str) -> None:
    mallopt = mallopt_function()
    if mallopt is None:
        raise SystemExit("this benchmark needs glibc's mallopt (Linux with glibc)")
    for param, value in SETTINGS[setting].items():
        if not mallopt(param, value):
            raise SystemExit(f"mallopt({param}, {value}) was rejected")


def peak_resident_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def sft_params(steps: int, seed: int) -> SFTParams:
    dtype = "bfloat16" if cpu_has_native_bf16() else "float32"
    return SFTParams(epochs=100, max_steps=steps, batch_size=4, micro_batch_size=4, learning_rate=2e-3,
                     eval_every=10**6, backend="torch", dtype=dtype, seed=seed)


def load(args):
    tokenizer, model, records = from_disk(args.data, args.model) if args.data else self_contained(args.queries)
    examples, _ = build_examples(tokenizer, records, cutoff_len=8192)
    return tokenizer, model, examples


def weights_digest(model) -> str:
    import hashlib

    digest = hashlib.md5()
    for p in model.parameters():
        digest.update(p.detach().numpy().tobytes())
    return digest.hexdigest()


def peak_of(args) -> None:
    """The child process: load, apply one setting, train, print JSON (peak resident, seconds, weights digest)."""
    tokenizer, model, examples = load(args)
    retain_freed_memory()  # cached: the loop's own call below is then a no-op and leaves the setting under test
    apply(args.peak_of)
    started = time.perf_counter()
    train_torch(model, tokenizer, examples, [], sft_params(args.memory_steps, 0), progress=False)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"setting": args.peak_of, "peak_mib": peak_resident_mib(),
                      "seconds": time.perf_counter() - started, "digest": weights_digest(model),
                      "system_s": usage.ru_stime, "minor_faults": usage.ru_minflt}))


def own_process(args, setting: str, steps: int, environ: dict | None = None) -> dict:
    """`peak_of`'s JSON from a fresh process that trains `steps` steps under `setting`."""
    command = [sys.executable, __file__, "--peak-of", setting, "--memory-steps", str(steps)]
    if args.data:
        command += ["--data", str(args.data), "--model", str(args.model)]
    else:
        command += ["--queries", str(args.queries)]
    done = subprocess.run(command, capture_output=True, text=True, check=True, env=environ)
    return json.loads(done.stdout.strip().splitlines()[-1])


def memory(args) -> list[dict]:
    return [own_process(args, setting, args.memory_steps) for setting in SETTINGS]


def huge_pages(args) -> dict[str, list[dict]]:
    """The shipped setting without and with the huge-page tunable, alternating fresh processes, `--rounds` each."""
    plain = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", HUGE_PAGES_OPT_OUT)}
    environs = {"4 KiB pages": plain, "huge pages": {**plain, "GLIBC_TUNABLES": HUGE_PAGES_TUNABLE}}
    runs: dict[str, list[dict]] = {name: [] for name in environs}
    for _ in range(args.rounds):
        for name, environ in environs.items():
            runs[name].append(own_process(args, "retained<4MB", args.huge_pages_steps, environ))
    return runs


def speed(args) -> tuple[dict, bool]:
    tokenizer, model, examples = load(args)
    retain_freed_memory()  # cached: the loop's own calls leave each block's setting alone
    models = {name: copy.deepcopy(model) for name in SETTINGS}
    totals = {name: [0, 0.0] for name in SETTINGS}
    for round_ in range(args.rounds):
        for name, m in models.items():
            apply(name)
            started = time.perf_counter()
            result = train_torch(m, tokenizer, examples, [], sft_params(args.steps, round_), progress=False)
            if round_:  # the first round warms every setting up (first-touch page faults, lazy initialisation)
                totals[name][0] += result.summary["tokens"]
                totals[name][1] += time.perf_counter() - started
    digests = {weights_digest(m) for m in models.values()}
    return {name: tokens / seconds for name, (tokens, seconds) in totals.items()}, len(digests) == 1


def rollout_speed(args) -> tuple[dict, bool]:
    from bench_rollout_chunks import rollouts

    from components.models.loading import load_policy_model, load_tokenizer
    from components.travel.queries import load_queries
    from components.travel.world import World

    tokenizer = load_tokenizer(args.rollouts)
    model = load_policy_model(args.rollouts, device="cpu")  # applies retain_freed_memory once
    world = World.load(args.world)
    queries = load_queries(args.rl_queries)[:4]
    totals = {name: [0, 0.0] for name in SETTINGS}
    turns = {}
    for round_ in range(args.rounds):
        for name in SETTINGS:
            apply(name)
            run = rollouts(model, tokenizer, world, queries, 0.6, 32, samples=4)
            turns.setdefault(name, run["turns"])
            if round_:
                totals[name][0] += run["sampled"]
                totals[name][1] += run["seconds"]
    same = all(t == turns["glibc"] for t in turns.values())
    return {name: tokens / seconds for name, (tokens, seconds) in totals.items()}, same


def report(title: str, rates: dict, same: bool, unit: str, compared: str) -> None:
    print(title)
    for name, rate in rates.items():
        print(f"  {name:14s} {rate:8.0f} {unit}   {rate / rates['glibc']:.2f}x glibc")
    print(f"  identical {compared}: {same}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_arguments(parser)
    parser.add_argument("--steps", type=int, default=6, help="optimiser steps per speed block (0: skip)")
    parser.add_argument("--rounds", type=int, default=4, help="alternating blocks of each setting (first: warm-up)")
    parser.add_argument("--memory-steps", type=int, default=0, help="steps of each setting's own process (0: skip)")
    parser.add_argument("--rollouts", type=Path, help="a trained checkpoint: also time one RL step's rollouts")
    parser.add_argument("--world", type=Path, default=Path("data/world"), help="with --rollouts")
    parser.add_argument("--rl-queries", type=Path, default=Path("data/queries/rl.jsonl"), help="with --rollouts")
    parser.add_argument("--huge-pages-steps", type=int, default=0,
                        help="steps of each process without and with huge pages (0: skip)")
    parser.add_argument("--peak-of", choices=list(SETTINGS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peak_of:
        return peak_of(args)
    print(f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
          f"torch {torch.__version__}")
    rounds = f"{args.rounds - 1} timed rounds (+1 warm-up)"
    if args.steps:
        report(f"SFT: {rounds} x {args.steps} steps of 4 sequences, alternating", *speed(args), "tokens/s", "weights")
    if args.rollouts:
        report(f"rollouts: {rounds} of 16 sampled episodes from {args.rollouts}", *rollout_speed(args),
               "sampled tokens/s", "episodes")
    if args.memory_steps:
        print(f"memory: {args.memory_steps} steps in a fresh process per setting")
        rows = memory(args)
        for row in rows:
            print(f"  {row['setting']:14s} peak resident {row['peak_mib']:7.0f} MiB   {row['seconds']:6.1f} s")
        print(f"  identical weights: {len({row['digest'] for row in rows}) == 1}")
    if args.huge_pages_steps:
        print(f"huge pages: {args.huge_pages_steps} steps a process, {args.rounds} alternating processes each "
              f"(glibc {glibc_version()}, transparent huge pages: {transparent_huge_page_mode()})")
        runs = huge_pages(args)
        for name, rows in runs.items():
            mean = {key: sum(row[key] for row in rows) / len(rows)
                    for key in ("seconds", "system_s", "minor_faults", "peak_mib")}
            each = ", ".join(f"{row['seconds']:.1f}" for row in rows)
            print(f"  {name:12s} {mean['seconds']:6.1f} s (runs: {each})"
                  f"   kernel {mean['system_s']:5.1f} s   {mean['minor_faults'] / 1e6:5.2f}M minor faults"
                  f"   peak {mean['peak_mib']:6.0f} MiB")
        base, huge = (sum(r["seconds"] for r in rows) / len(rows) for rows in runs.values())
        print(f"  huge pages: {base / huge:.2f}x the speed of 4 KiB pages; identical weights: "
              f"{len({row['digest'] for rows in runs.values() for row in rows}) == 1}")


if __name__ == "__main__":
    main()
