"""Benchmark decoding turns in rounds (`chunk_tokens`) against one `generate` call per turn, side by side, and
rounds in which turns overlap against rounds in lockstep, the CPU decoding attention
(components/models/attention.py) against SDPA, and the lean decoder (components/agent/lean_decode.py) against
`generate` (`--decoders`: only that pair, alternated `--rounds` times, the shipped setting of each).

HFPolicy decodes the tiny preset's model on a CPU with the lean decoder, no choice offered; every `generate` row is
`GenerateBaseline`, HFPolicy held on the `generate` path it takes for GPUs and other architectures (episode caches,
rounds and all), so that the baseline is what `generate` itself does with the same turns.

`generate` computes every row of its batch until the LAST row ends its turn: with 16-40 episodes in lockstep, one
turn that runs on to the token limit (768 tokens) makes every other row pay for it, and ordinary turns differ a lot
in length too (a tool call ~100 tokens, the final plan ~500). Decoding in rounds of `chunk_tokens` re-batches only
the episodes still writing after each round (their key/value caches carry over, so nothing is recomputed).

In lockstep, an episode whose turn ended waits until every other episode's turn has ended. With `generate_round`
(what `loop.run_episodes` uses) it takes its environment step at once and writes its next turn in the next round,
beside the longer turns still being written, so rounds stay wider and fewer. The lockstep rows hide
`generate_round` from the loop.

Needs a trained checkpoint, so that turns have realistic lengths (an untrained model writes every turn to the
limit, where rounds cannot help): the tiny preset's SFT checkpoint after `dvc repro sft`.

    python benchmarks/bench_rollout_chunks.py                        # models/sft on data/queries/val.jsonl, ~4 min
    python benchmarks/bench_rollout_chunks.py --temperature 0.6      # sampled
    python benchmarks/bench_rollout_chunks.py --temperature 0.6 --queries data/queries/rl.jsonl \
        --max-queries 4 --samples 4                                  # one RL step's 16 episodes
    python benchmarks/bench_rollout_chunks.py --decoders --rounds 2  # lean decoder vs generate, ~5 min
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
from components.models.attention import CPU_DECODE_ATTENTION, register_cpu_decode_attention
from components.models.loading import load_policy_model, load_tokenizer
from components.training.rl.engine import RolloutEngine
from components.travel.tasks import load_queries
from components.travel.source import TravelSource
from components.travel.world import World
from components.agent.types import TurnPolicy

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


class GenerateBaseline(HFPolicy):
    """HFPolicy decoding its cached turns with transformers' `generate` even for a model the lean decoder serves: the
    baseline (a benchmark's, not a setting of the product)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lean = False


class Lockstep(TurnPolicy):
    """An HFPolicy without `generate_round`: the loop then decodes every turn of a batch before any episode moves on."""

    def __init__(self, policy: HFPolicy):
        self.policy = policy

    def generate(self, requests):
        return self.policy.generate(requests)


def rollouts(model, tokenizer, world, queries, temperature: float, chunk_tokens: int | None,
             overlap: bool = True, samples: int = 1, attention: str = CPU_DECODE_ATTENTION,
             lean: bool = False) -> dict:
    """`samples` episodes per query through the RL engine in one batch, as `star validate` and `star rl` run them,
    with the model's attention implementation set to `attention` (the lean decoder has its own), decoded by HFPolicy
    (`lean`: the lean decoder) or `GenerateBaseline`."""
    model.set_attn_implementation(attention)
    greedy = temperature <= 0
    policy = (HFPolicy if lean else GenerateBaseline)(model, tokenizer, temperature=1.0 if greedy else temperature,
                                                      greedy=greedy, seed=0, chunk_tokens=chunk_tokens)
    assert policy.lean == lean, "the lean decoder does not serve this model"
    policy = policy if overlap else Lockstep(policy)
    engine = RolloutEngine(policy, tokenizer, world, Limits(max_turns=14, max_tokens_per_turn=768,
                                                            max_context_tokens=8192))
    engine.begin_step(1)
    start = time.perf_counter()
    records = [record for group in engine.groups(queries, samples) for record in group]
    seconds = time.perf_counter() - start
    sampled = sum(sum(r["response_mask"]) for r in records)
    return {"seconds": seconds, "sampled": sampled, "tokens_per_s": sampled / seconds,
            "turns": [r["response_ids"] for r in records],
            "delivered": sum(r.get("plan") is not None for r in records)}


def alternated(makers: dict, rounds: int) -> dict:
    """Run each maker `rounds` times, alternating (a noisy machine slows every row alike), and merge its runs:
    seconds and tokens summed, turns and deliveries of the last run."""
    runs: dict = {}
    for _ in range(rounds):
        for name, make in makers.items():
            result = make()
            merged = runs.setdefault(name, {**result, "seconds": 0.0, "sampled": 0})
            merged.update(turns=result["turns"], delivered=result["delivered"],
                          seconds=merged["seconds"] + result["seconds"], sampled=merged["sampled"] + result["sampled"])
            merged["tokens_per_s"] = merged["sampled"] / merged["seconds"]
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/sft", help="a trained checkpoint directory (default models/sft)")
    parser.add_argument("--world", default="data/world")
    parser.add_argument("--queries", default="data/queries/val.jsonl")
    parser.add_argument("--max-queries", type=int, default=40)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (the default)")
    parser.add_argument("--samples", type=int, default=1, help="episodes per query (RL: 4 per query)")
    parser.add_argument("--chunks", type=int, nargs="+", default=[32])
    parser.add_argument("--decoders", action="store_true",
                        help="only the lean decoder against generate (rounds of the first --chunks, turns overlap)")
    parser.add_argument("--rounds", type=int, default=2, help="with --decoders: alternations of the pair")
    parser.add_argument("--append", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = parser.parse_args()
    for path in (args.model, args.world, args.queries):
        if not Path(path).exists():
            sys.exit(f"{path} does not exist: build the tiny preset's SFT checkpoint first (`dvc repro sft`), "
                     "or pass --model/--world/--queries")

    tokenizer = load_tokenizer(args.model)
    model = load_policy_model(args.model, device="cpu")
    world = TravelSource(World.load(args.world))  # the engine rolls out a task source
    queries = load_queries(args.queries)[: args.max_queries]
    rollouts(model, tokenizer, world, queries[:2], args.temperature, None)  # warm-up (allocator, kernels)

    def run(chunk, overlap=True, attention=register_cpu_decode_attention(), lean=False):
        return rollouts(model, tokenizer, world, queries, args.temperature, chunk, overlap, args.samples, attention,
                        lean)

    if args.decoders:
        runs = alternated({name: (lambda lean=lean: run(args.chunks[0], lean=lean))
                           for name, lean in [(f"generate, rounds of {args.chunks[0]} tokens (baseline)", False),
                                              (f"lean decoder, rounds of {args.chunks[0]} tokens", True)]},
                          args.rounds)
    else:
        runs = {"one call per turn, SDPA (baseline)": run(None, attention="sdpa")}
        for chunk in args.chunks:
            runs[f"rounds of {chunk} tokens, lockstep, SDPA"] = run(chunk, overlap=False, attention="sdpa")
            runs[f"rounds of {chunk} tokens, turns overlap, SDPA"] = run(chunk, attention="sdpa")
            runs[f"rounds of {chunk} tokens, turns overlap, matrix-product decoding"] = run(chunk)
            runs[f"rounds of {chunk} tokens, turns overlap, lean decoder"] = run(chunk, lean=True)

    base = next(iter(runs.values()))
    mode = "greedy" if args.temperature <= 0 else f"temperature {args.temperature}"
    lines = [
        f"\n### {'The lean decoder against generate' if args.decoders else 'Decoding turns in rounds'} "
        f"(`bench_rollout_chunks.py`, {datetime.date.today()})\n",
        f"Machine: {platform.machine()} {platform.system()}, {os.cpu_count()} cores, torch {torch.__version__}; "
        f"{len(queries)} queries of `{args.queries}` x {args.samples} episodes in one batch from `{args.model}`, "
        f"{mode}, {torch.get_num_threads()} threads"
        + (f"; each row {args.rounds} runs, alternated" if args.decoders else "") + ".\n",
        "| decoding | seconds | sampled tokens | tokens/s | vs baseline | vs the row above | episodes identical to "
        "baseline | delivered |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    previous = base
    for name, run in runs.items():
        same = sum(a == b for a, b in zip(run["turns"], base["turns"]))  # under sampling, draws differ by batch
        lines.append(f"| {name} | {run['seconds']:.1f} | {run['sampled']} | {run['tokens_per_s']:.0f} | "
                     f"{base['seconds'] / run['seconds']:.2f}x | {previous['seconds'] / run['seconds']:.2f}x | "
                     f"{same}/{len(run['turns'])} | {run['delivered']}/{len(run['turns'])} |")
        previous = run
    table = "\n".join(lines)
    print(table)
    if args.append:
        with RESULTS.open("a") as handle:
            handle.write(table + "\n")


if __name__ == "__main__":
    main()
