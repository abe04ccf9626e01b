"""Benchmark the CPU SFT loop: float32 against bf16 autocast (`sft.dtype: bfloat16`), side by side in one process.

Both runs train the same model (copied from one initialisation) on the same SFT examples with the same params, for
the same number of optimiser steps, in the plain torch loop the tiny preset uses (loss only at trained positions).
The runs alternate in rounds (fp32 block, bf16 block, ...) so a change in the machine's load hits both; the
benchmark prints each one's trained tokens per second and the ratio.

    python benchmarks/bench_sft_autocast.py --data data/sft --model models/base   # a built pipeline's data/base
    python benchmarks/bench_sft_autocast.py                                        # self-contained: expert data
    python benchmarks/bench_sft_autocast.py --queries 8 --layers 2 --steps 1 --rounds 1 --batch-size 1   # quick

Self-contained, the model is SmolLM2-135M's tokenizer and architecture with random weights (benchmarks/random_base.py;
`--layers` of its 30), trained on expert trajectories of the tiny synthetic world.
"""
from __future__ import annotations

import argparse
import copy
import platform
import time
from pathlib import Path

import torch

from components.training.sft import SFTParams, build_examples, load_records, train_torch
from random_base import add_model_arguments


def self_contained(num_queries: int, layers: int):
    """SmolLM2's tokenizer, a random model of its shape and expert trajectories of the tiny synthetic world (nothing on
    disk needed)."""
    from bench_generation import expert_trajectories
    from random_base import random_base

    from components.synthesis.filter import FilterParams, estimate_counter, filter_trajectories

    records, _ = filter_trajectories(expert_trajectories(num_queries), FilterParams(), estimate_counter(4.2))
    tokenizer, model = random_base(layers)
    return tokenizer, model, records


def from_disk(data: Path, model_dir: Path):
    from components.models.loading import load_policy_model, load_tokenizer

    return load_tokenizer(model_dir), load_policy_model(model_dir, dtype="float32", device="cpu"), \
        load_records(data / "train.jsonl")


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """--data/--model (a built pipeline's SFT data and base) or --queries (self-contained expert data)."""
    parser.add_argument("--data", type=Path, help="an sft_data output folder (train.jsonl)")
    parser.add_argument("--model", type=Path, help="a base checkpoint folder (with --data)")
    parser.add_argument("--queries", type=int, default=120, help="expert trajectories without --data")
    add_model_arguments(parser)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_arguments(parser)
    parser.add_argument("--steps", type=int, default=6, help="optimiser steps per block")
    parser.add_argument("--rounds", type=int, default=3, help="alternating fp32/bf16 blocks of each")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per optimiser step")
    args = parser.parse_args()

    tokenizer, model, records = from_disk(args.data, args.model) if args.data else self_contained(args.queries, args.layers)
    examples, _ = build_examples(tokenizer, records, cutoff_len=8192)
    params = SFTParams(epochs=100, max_steps=args.steps, batch_size=args.batch_size,
                       micro_batch_size=min(4, args.batch_size), learning_rate=2e-3,
                       eval_every=10**6, backend="torch")
    models = {"float32": model, "bfloat16": copy.deepcopy(model)}
    totals = {name: [0, 0.0] for name in models}
    for round_ in range(args.rounds):
        for name, m in models.items():
            run_params = params.model_copy(update={"dtype": name, "seed": round_})
            started = time.perf_counter()
            result = train_torch(m, tokenizer, examples, [], run_params, progress=False)
            totals[name][0] += result.summary["tokens"]
            totals[name][1] += time.perf_counter() - started
    speed = {name: tokens / seconds for name, (tokens, seconds) in totals.items()}
    print(f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
          f"torch {torch.__version__}")
    print(f"{len(examples)} examples, {args.rounds} rounds x {args.steps} steps of {args.batch_size} sequences each")
    for name, value in speed.items():
        print(f"{name:9s} {value:8.0f} tokens/s")
    print(f"bf16 autocast / fp32: {speed['bfloat16'] / speed['float32']:.2f}x")


if __name__ == "__main__":
    main()
