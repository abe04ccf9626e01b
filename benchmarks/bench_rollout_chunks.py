"""Benchmark decoding a turn in rounds (`chunk_tokens`) against one `generate` call per turn, side by side.

`generate` computes every row of its batch until the LAST row ends its turn: with 16-40 episodes in lockstep, one
turn that runs on to the token limit (768 tokens) makes every other row pay for it, and ordinary turns differ a lot
in length too (a tool call ~100 tokens, the final plan ~500). Decoding in rounds of `chunk_tokens` re-batches only
the episodes still writing after each round (their key/value caches carry over, so nothing is recomputed).

Needs a trained checkpoint, so that turns have realistic lengths (an untrained model writes every turn to the
limit, where rounds cannot help): the tiny preset's SFT checkpoint after `dvc repro sft`.

    python benchmarks/bench_rollout_chunks.py                        # models/sft on data/queries/val.jsonl, ~4 min
    python benchmarks/bench_rollout_chunks.py --temperature 0.6      # sampled, as RL rolls out
    python benchmarks/bench_rollout_chunks.py --append               # also append the table to RESULTS.md
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from pathlib import Path

import torch

from components.agent.hf import HFPolicy
from components.agent.loop import Limits
from components.models.loading import load_policy_model, load_tokenizer
from components.training.rl.engine import RolloutEngine
from components.travel.queries import load_queries
from components.travel.world import World

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def rollouts(model, tokenizer, world, queries, temperature: float, chunk_tokens: int | None) -> dict:
    """One episode per query through the RL engine (all in lockstep, as `star validate` and `star rl` run them)."""
    greedy = temperature <= 0
    policy = HFPolicy(model, tokenizer, temperature=1.0 if greedy else temperature, greedy=greedy, seed=0,
                      chunk_tokens=chunk_tokens)
    engine = RolloutEngine(policy, tokenizer, world, Limits(max_turns=14, max_tokens_per_turn=768,
                                                            max_context_tokens=8192))
    engine.begin_step(1)
    start = time.perf_counter()
    records = [group[0] for group in engine.groups(queries, 1)]
    seconds = time.perf_counter() - start
    sampled = sum(sum(r["response_mask"]) for r in records)
    return {"seconds": seconds, "sampled": sampled, "tokens_per_s": sampled / seconds,
            "turns": [r["response_ids"] for r in records],
            "delivered": sum(r.get("plan") is not None for r in records)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/sft", help="a trained checkpoint directory (default models/sft)")
    parser.add_argument("--world", default="data/world")
    parser.add_argument("--queries", default="data/queries/val.jsonl")
    parser.add_argument("--max-queries", type=int, default=40)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (the default)")
    parser.add_argument("--chunks", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--append", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = parser.parse_args()
    for path in (args.model, args.world, args.queries):
        if not Path(path).exists():
            sys.exit(f"{path} does not exist: build the tiny preset's SFT checkpoint first (`dvc repro sft`), "
                     "or pass --model/--world/--queries")

    tokenizer = load_tokenizer(args.model)
    model = load_policy_model(args.model, device="cpu")
    world = World.load(args.world)
    queries = load_queries(args.queries)[: args.max_queries]
    rollouts(model, tokenizer, world, queries[:2], args.temperature, None)  # warm-up (allocator, kernels)

    runs = {"one call per turn (baseline)": rollouts(model, tokenizer, world, queries, args.temperature, None)}
    for chunk in args.chunks:
        runs[f"rounds of {chunk} tokens"] = rollouts(model, tokenizer, world, queries, args.temperature, chunk)

    base = runs["one call per turn (baseline)"]
    mode = "greedy" if args.temperature <= 0 else f"temperature {args.temperature}"
    lines = [
        f"\n### Decoding turns in rounds (`bench_rollout_chunks.py`, {datetime.date.today()})\n",
        f"Machine: {platform.machine()} {platform.system()}, {os.cpu_count()} cores, torch {torch.__version__}; "
        f"{len(queries)} episodes of `{args.queries}` in lockstep from `{args.model}`, {mode}.\n",
        "| decoding | seconds | sampled tokens | tokens/s | vs baseline | turns identical to baseline | delivered |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, run in runs.items():
        same = sum(a == b for a, b in zip(run["turns"], base["turns"]))
        lines.append(f"| {name} | {run['seconds']:.1f} | {run['sampled']} | {run['tokens_per_s']:.0f} | "
                     f"{base['seconds'] / run['seconds']:.2f}x | {same}/{len(queries)} | "
                     f"{run['delivered']}/{len(queries)} |")
    table = "\n".join(lines)
    print(table)
    if args.append:
        with RESULTS.open("a") as handle:
            handle.write(table + "\n")


if __name__ == "__main__":
    main()
