"""Benchmark CPU generation with the tiny preset's model: all episodes of a turn in one batched call vs one at a time.

Side by side in one process, on the same 50 episodes, turns and model, four ways to serve the loop's turns:
  - baseline: one `generate` call per episode per turn, the whole context re-read every turn
    (`HFPolicy(reuse_cache=False)` fed one request at a time: a loop without batching);
  - batched: one left-padded `generate` call for all episodes of a turn (`HFPolicy(reuse_cache=False)`);
  - batched + cache: the same call, with each episode's key/value cache kept across turns so only the new tokens
    are read (`GenerateBaseline`: HFPolicy held on the `generate` path it takes for GPUs and other architectures);
  - batched + cache, lean decoder: what `HFPolicy()` does with this model on a CPU (components/agent/lean_decode.py).
All decode greedily, so they must produce the same tokens; the benchmark asserts it.

The episodes are real: the programmatic expert solves queries of the tiny synthetic world through the agent loop,
and the benchmark replays its trajectories turn by turn (teacher forcing): at turn t every episode's context is the
expert's trajectory before its t-th assistant turn (system prompt with the tool schemas, query, earlier turns and
tool responses) encoded with the loop's own segments, and the model samples up to `--new-tokens` tokens. The
model has the tiny preset's tokenizer and architecture (SmolLM2-135M, `--layers` of its 30) with random weights
(benchmarks/random_base.py); untrained, it rarely samples `<|im_end|>`, so turns run to `--new-tokens` (tokens/s
counts the tokens generated). The lean decoder against `generate` on the SmolLM2 weights is also
benchmarks/bench_smollm2.py's.

    python benchmarks/bench_generation.py --episodes 16    # SmolLM2's full depth: many minutes on 2 shared cores
    python benchmarks/bench_generation.py --episodes 8 --turns 2 --new-tokens 16 --layers 2   # a quick run
"""
from __future__ import annotations

import argparse
import platform
import tempfile
import time
from pathlib import Path

import torch
import transformers

from components.agent import tokens
from components.agent.hf import HFPolicy
from components.agent.loop import Limits, run_episodes
from components.travel.env import travel_episodes
from components.travel.evaluate import travel_evaluate
from components.agent.types import TurnRequest
from components.travel.expert import ExpertConfig, ExpertPolicy
from components.travel.queries import QueriesParams, synthesize_splits
from components.travel.synthetic import tiny_world_params, write_synthetic_world
from components.travel.world import World
from random_base import add_model_arguments, describe, random_base


class GenerateBaseline(HFPolicy):
    """HFPolicy decoding its cached turns with transformers' `generate` even for a model the lean decoder serves: a
    baseline (a benchmark's, not a setting of the product)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lean = False


def expert_trajectories(num_queries: int) -> list[dict]:
    """Expert trajectory records on the tiny synthetic world, evaluated like the teacher stage's (the SFT filter
    keeps only the strict passes)."""
    with tempfile.TemporaryDirectory() as tmp:
        write_synthetic_world(tiny_world_params(), Path(tmp) / "world")
        world = World.load(Path(tmp) / "world")
    splits, _ = synthesize_splits(world, QueriesParams(sizes={"sft": num_queries, "rl": 0, "val": 0}),
                                  progress=False)
    return run_episodes(travel_episodes(world, splits["sft"]), ExpertPolicy(ExpertConfig(seed=0)), Limits(),
                        evaluate=travel_evaluate(world), progress=False)


def context_ids(tokenizer, messages: list[dict], cut: int) -> list[int]:
    """Token ids of a trajectory's context before its `cut`-th assistant turn, built from the loop's segments."""
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    ids = tokens.prompt_ids(tokenizer, messages[:first])
    assistant_turns = 0
    for message in messages[first:]:
        if message["role"] == "assistant":
            if assistant_turns == cut:
                break
            assistant_turns += 1
            ids += tokens.assistant_ids(tokenizer, message["content"])
        else:
            ids += tokens.tool_segment_ids(tokenizer, message["content"])
    return ids


def turn_requests(contexts: list[list[list[int]]], turn: int, new_tokens: int) -> list[TurnRequest]:
    """The requests of one lockstep turn: every episode's context before assistant turn `turn`."""
    return [TurnRequest(messages=[], token_ids=episode[turn], max_new_tokens=new_tokens, episode_id=str(i))
            for i, episode in enumerate(contexts)]


def replay(policy: HFPolicy, contexts: list[list[list[int]]], new_tokens: int, one_at_a_time: bool):
    """Generate every turn of every episode; returns (generated ids per turn and episode, wall seconds)."""
    generated = []
    start = time.perf_counter()
    for turn in range(len(contexts[0])):
        requests = turn_requests(contexts, turn, new_tokens)
        if one_at_a_time:
            results = [policy.generate([request])[0] for request in requests]
        else:
            results = policy.generate(requests)
        generated.append([r.token_ids for r in results])
    return generated, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--turns", type=int, default=3, help="lockstep turns replayed per episode")
    parser.add_argument("--new-tokens", type=int, default=48, help="max_new_tokens per turn")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0)
    add_model_arguments(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    start = time.perf_counter()
    records = expert_trajectories(max(args.episodes, 60))
    tokenizer, model = random_base(args.layers, seed=args.seed)
    setup = time.perf_counter() - start
    usable = [r for r in records if sum(m["role"] == "assistant" for m in r["messages"]) >= args.turns]
    contexts = [[context_ids(tokenizer, r["messages"], cut=t) for t in range(args.turns)]
                for r in usable[:args.episodes]]
    lengths = sorted(len(c) for episode in contexts for c in episode)

    def policy(kind=HFPolicy, **options) -> HFPolicy:
        return kind(model, tokenizer, greedy=True, **options)

    assert policy().lean, "the lean decoder serves this model"
    policy(GenerateBaseline).generate(turn_requests(contexts[:2], 0, 4))  # warm-up
    policy().generate(turn_requests(contexts[:2], 0, 4))
    single, single_s = replay(policy(reuse_cache=False), contexts, args.new_tokens, one_at_a_time=True)
    batched, batched_s = replay(policy(reuse_cache=False), contexts, args.new_tokens, one_at_a_time=False)
    cached, cached_s = replay(policy(GenerateBaseline), contexts, args.new_tokens, one_at_a_time=False)
    lean, lean_s = replay(policy(), contexts, args.new_tokens, one_at_a_time=False)
    assert batched == single, "batched != one at a time under greedy decoding"
    assert cached == single, "batched with cache reuse (generate) != one at a time under greedy decoding"
    assert lean == single, "batched with cache reuse (lean decoder) != one at a time under greedy decoding"
    generated = sum(len(ids) for turn in single for ids in turn)

    print(f"machine: {platform.machine()} {platform.system()}, Python {platform.python_version()}, torch "
          f"{torch.__version__}, transformers {transformers.__version__}, {args.threads} torch threads")
    print(f"model: {describe(model, tokenizer)}; setup {setup:.1f} s")
    print(f"{len(contexts)} episodes x {args.turns} turns; contexts of {lengths[0]}-{lengths[-1]} tokens (median "
          f"{lengths[len(lengths) // 2]}); {generated} tokens generated per variant (max {args.new_tokens} per "
          "turn); same ids in all variants: yes")
    print("| variant | wall s | generated tokens/s | vs one at a time |")
    print("|---|---:|---:|---:|")
    for name, seconds in (("one episode at a time, context re-read each turn (baseline)", single_s),
                          (f"all {len(contexts)} episodes in one batched call per turn", batched_s),
                          ("batched + per-episode KV cache across turns, `generate`", cached_s),
                          ("batched + per-episode KV cache, lean decoder (HFPolicy on a CPU)", lean_s)):
        print(f"| {name} | {seconds:.2f} | {generated / seconds:,.0f} | **{single_s / seconds:.2f}x** |")


if __name__ == "__main__":
    main()
