"""Benchmark the RL stage on CPU: rollout tokens/s, trainer tokens/s, and where a step's time goes.

On the tiny synthetic world with a model of the tiny preset's size (Qwen2, hidden 192, 3 layers, BPE vocab 4096
trained on expert trajectories):
  - rollouts: sampled tokens/s of the RolloutEngine (transformers `generate` through the agent loop), every episode
    of a step in one padded batch per turn, side by side with one episode at a time (the baseline);
  - update: tokens/s of the policy update (forward + backward of the clipped objective) on realistic multi-turn
    expert trajectories, micro-batches of 4 side by side with micro-batches of 1 (the baseline); and pi_old read off
    the update's own pass side by side with a separate no-grad recompute pass (the baseline);
  - a full trainer step (`train`, GRPO, SUM reward): the split between rollout, reward (strict evaluator) and update.

    python benchmarks/bench_rl.py            # about 3-5 minutes on 2 cores
    python benchmarks/bench_rl.py --append   # also append the tables to benchmarks/RESULTS.md
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import tempfile
import time
from pathlib import Path

import torch

from components.agent.loop import Limits
from components.agent.tokens import render_prompt
from components.models.checkpoints import save_checkpoint
from components.models.factory import build_tiny_model, count_parameters
from components.models.tokenizer import build_tiny_tokenizer
from components.synthesis.expert import ExpertConfig, ExpertPolicy
from components.synthesis.synthesize import QueriesParams, synthesize_splits
from components.training.rl.engine import RolloutEngine
from components.training.rl.optim import TorchOptimizer
from components.training.rl.params import RLParams
from components.training.rl.trainer import RLPaths, train
from components.training.rl.update import UpdateConfig, fill_logprobs, rollout_from_record, update_policy
from components.travel.queries import dump_queries
from components.travel.synthetic import tiny_world_params, write_synthetic_world
from components.travel.world import World

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def expert_records(world, queries, tokenizer) -> list[dict]:
    """Multi-turn expert trajectories with token ids and masks (the loop encodes the expert's text turns)."""
    engine = RolloutEngine(ExpertPolicy(ExpertConfig(seed=0)), tokenizer, world, Limits(max_context_tokens=16384))
    return [r for group in engine.groups(queries, 1) for r in group]


def rollout_throughput(model, tokenizer, world, queries, group_size: int, max_batch_size: int | None) -> dict:
    from components.agent.hf import HFPolicy

    policy = HFPolicy(model, tokenizer, temperature=1.0, seed=0, max_batch_size=max_batch_size)
    engine = RolloutEngine(policy, tokenizer, world, Limits(max_turns=2, max_tokens_per_turn=64,
                                                            max_context_tokens=8192))
    start = time.perf_counter()
    records = [r for group in engine.groups(queries, group_size) for r in group]
    wall = time.perf_counter() - start
    sampled = sum(sum(r["response_mask"]) for r in records)
    return {"episodes": len(records), "sampled": sampled, "wall": wall, "tokens_per_s": sampled / wall}


def update_throughput(model, records, micro_batch_size: int, pad_id: int, separate_old_pass: bool = False,
                      logit_scale: bool = False) -> dict:
    """One GRPO update (one optimizer step) on `records`. `separate_old_pass`: the baseline that first recomputes
    pi_old in its own no-grad pass over every sequence (what the stage did before session 33) instead of reading it
    off the update's forward pass. `logit_scale`: the tiny preset's RL since session 46, only the learned logit scale
    trained (`rl.trainable_parameters: [model.norm.weight]`, `rl.logit_scale_lr`), so the backward pass stops at the
    final norm. The model's weights are restored afterwards, so every call times the same update."""
    from components.training.rl.optim import FINAL_NORM

    rng = random.Random(0)
    rollouts = [rollout_from_record(r, rng.choice([-1.0, 1.0])) for r in records]
    saved = {name: p.detach().clone() for name, p in model.named_parameters()}
    for name, p in model.named_parameters():
        p.requires_grad_(not logit_scale or name == FINAL_NORM)
    optimizer = TorchOptimizer(model, 1e-5, 0.0, 1.0, "constant", 0, 1, logit_scale_lr=0.1 if logit_scale else None)
    start = time.perf_counter()
    if separate_old_pass:
        fill_logprobs(model, rollouts, micro_batch_size, pad_id, 1.0, overwrite=True)
    config = UpdateConfig(micro_batch_size=micro_batch_size, recompute_old_logprobs=not separate_old_pass)
    stats = update_policy(model, optimizer, rollouts, config, pad_id)
    wall = time.perf_counter() - start
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(saved[name])
            p.requires_grad_(True)
    tokens = sum(len(r.input_ids) for r in rollouts)
    return {"tokens": tokens, "trained": stats["trained_tokens"], "wall": wall, "tokens_per_s": tokens / wall}


def fastest_of_alternated(first, second, rounds: int = 2) -> tuple[dict, dict]:
    """Run `first` and `second` alternately `rounds` times each; the faster run of each (by "wall")."""
    a, b = [], []
    for _ in range(rounds):
        a.append(first())
        b.append(second())
    return min(a, key=lambda r: r["wall"]), min(b, key=lambda r: r["wall"])


def trainer_steps(model_dir: Path, world_dir: Path, queries_path: Path, work: Path, steps: int) -> list[dict]:
    # A random-weight model earns no reward, so every group ties and GRPO alone would take no step (update 0 s); the
    # turn-level credit on its rejected and cut turns gives the update a gradient, so the split is a real step's.
    params = RLParams.model_validate({
        "max_steps": steps, "queries_per_step": 2, "num_generations": 4, "micro_batch_size": 4,
        "rejected_turn_advantage": -1.0, "rejected_turn_kinds": ["protocol_error", "truncated"],
        "rollout": {"max_turns": 3, "max_tokens_per_turn": 64, "max_context_tokens": 8192}})
    paths = RLPaths(model=model_dir, world=world_dir, queries=queries_path, out=work / "out",
                    checkpoints=work / "ckpt", metrics=work / "rl.json", plots=work / "plots")
    logged: list[dict] = []
    train(params, paths, log=lambda metrics, step: logged.append(metrics), progress_bar=False)
    return logged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--append", action="store_true", help="append the results to benchmarks/RESULTS.md")
    args = parser.parse_args()
    torch.manual_seed(0)
    lines: list[str] = []

    def out(text: str = "") -> None:
        print(text)
        lines.append(text)

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        write_synthetic_world(tiny_world_params(), tmp / "world")
        world = World.load(tmp / "world")
        splits, _ = synthesize_splits(world, QueriesParams(sizes={"sft": 0, "rl": args.queries, "val": 0}),
                                      progress=False)
        queries = splits["rl"]
        dump_queries(queries, tmp / "rl.jsonl")

        # a tokenizer trained on expert trajectories (as the tiny preset's), then the expert's token records
        class Whitespace:  # a throwaway tokenizer to let the loop run the text expert once
            def encode(self, text, add_special_tokens=False):
                return [0] * max(1, len(text) // 4)

        corpus = [render_prompt(r["messages"]) for r in expert_records(world, queries, Whitespace())]
        tokenizer = build_tiny_tokenizer(corpus * 4, vocab_size=4096)
        records = expert_records(world, queries, tokenizer)
        model = build_tiny_model(tokenizer, seed=0)
        save_checkpoint(model, tokenizer, tmp / "model", stage="bench")

        batched = rollout_throughput(model, tokenizer, world, queries, args.group_size, max_batch_size=None)
        single = rollout_throughput(model, tokenizer, world, queries[: max(1, args.queries // 4)], args.group_size,
                                    max_batch_size=1)
        pad_id = tokenizer.pad_token_id
        update_throughput(model, records, 4, pad_id)  # untimed warm-up: the first update pays one-off allocations
        # each pair alternated (A B A B) and the faster of two runs kept: the machines are noisy
        micro4, micro1 = fastest_of_alternated(
            lambda: update_throughput(model, records, 4, pad_id), lambda: update_throughput(model, records, 1, pad_id))
        reads, separate = fastest_of_alternated(
            lambda: update_throughput(model, records, 4, pad_id),
            lambda: update_throughput(model, records, 4, pad_id, separate_old_pass=True))
        scale_only, every_weight = fastest_of_alternated(
            lambda: update_throughput(model, records, 4, pad_id, logit_scale=True),
            lambda: update_throughput(model, records, 4, pad_id))
        steps = trainer_steps(tmp / "model", tmp / "world", tmp / "rl.jsonl", tmp / "run", args.steps)

    mean_len = sum(len(r["prompt_ids"]) + len(r["response_ids"]) for r in records) / len(records)
    out(f"## RL stage on CPU (`benchmarks/bench_rl.py`)")
    out()
    out(f"Machine: {platform.machine()} {platform.system()}, {os.cpu_count()} cores (shared with other jobs), "
        f"Python {platform.python_version()}, torch {torch.__version__}, {datetime.date.today()}.")
    out(f"Command: `python benchmarks/bench_rl.py` ({args.queries} RL queries of the tiny world, G = {args.group_size}). "
        f"Model: tiny preset size, {count_parameters(model) / 1e6:.2f} M parameters, vocab {len(tokenizer)}, "
        "randomly initialised (speed does not depend on the weights; an untrained model mostly fills each turn up "
        "to the 64-token limit).")
    out()
    out("| rollouts (transformers generate through the agent loop) | episodes | sampled tokens | tokens/s | vs baseline |")
    out("|---|---:|---:|---:|---:|")
    out(f"| one episode per generate call (baseline) | {single['episodes']} | {single['sampled']} | "
        f"{single['tokens_per_s']:.0f} | 1.00x |")
    out(f"| all {batched['episodes']} episodes of a step in one padded batch | {batched['episodes']} | "
        f"{batched['sampled']} | {batched['tokens_per_s']:.0f} | {batched['tokens_per_s'] / single['tokens_per_s']:.2f}x |")
    out()
    out(f"| update on {len(records)} expert trajectories (mean {mean_len:.0f} tokens; faster of 2, alternated) | tokens | seconds | "
        "tokens/s | vs baseline |")
    out("|---|---:|---:|---:|---:|")
    out(f"| micro-batch 1 (baseline) | {micro1['tokens']} | {micro1['wall']:.1f} | {micro1['tokens_per_s']:.0f} | 1.00x |")
    out(f"| micro-batch 4 | {micro4['tokens']} | {micro4['wall']:.1f} | {micro4['tokens_per_s']:.0f} | "
        f"{micro4['tokens_per_s'] / micro1['tokens_per_s']:.2f}x |")
    out("(tokens/s counts every sequence token once; one update is one optimizer step, so pi_old is read off its own "
        "forward + backward pass: no separate no-grad pass.)")
    out()
    out("| update, micro-batch 4 (best of 2, alternated) | seconds | vs baseline |")
    out("|---|---:|---:|")
    out(f"| pi_old recomputed in a separate no-grad pass (baseline, before session 33) | {separate['wall']:.1f} | "
        "1.00x |")
    out(f"| pi_old = the update pass's own detached log-probabilities | {reads['wall']:.1f} | "
        f"{separate['wall'] / reads['wall']:.2f}x |")
    out()
    out("| update, micro-batch 4 (best of 2, alternated) | seconds | tokens/s | vs baseline |")
    out("|---|---:|---:|---:|")
    out(f"| every weight trained (baseline; the real presets) | {every_weight['wall']:.1f} | "
        f"{every_weight['tokens_per_s']:.0f} | 1.00x |")
    out(f"| only the logit scale (the tiny preset since session 46) | {scale_only['wall']:.1f} | "
        f"{scale_only['tokens_per_s']:.0f} | {every_weight['wall'] / scale_only['wall']:.2f}x |")
    out()
    out("| trainer step (GRPO, SUM + turn-level credit, 2 queries x 4) | rollout s | reward s | update s | step s | "
        "rollout share |")
    out("|---|---:|---:|---:|---:|---:|")
    for i, m in enumerate(steps, 1):
        out(f"| step {i} | {m['time/rollout_s']:.2f} | {m['time/reward_s']:.3f} | {m['time/update_s']:.2f} | "
            f"{m['time/step_s']:.2f} | {m['time/rollout_s'] / m['time/step_s']:.0%} |")
    out()
    print(json.dumps({"rollout": {"batched": batched, "single": single}, "update": {"micro4": micro4, "micro1": micro1}},
                     indent=1))
    if args.append:
        with RESULTS.open("a") as handle:
            handle.write("\n" + "\n".join(lines) + "\n")
        print(f"appended to {RESULTS}")


if __name__ == "__main__":
    main()
