"""Benchmark the RL stage on CPU: rollout tokens/s, trainer tokens/s, and where a step's time goes.

On the tiny synthetic world (3-day queries, as the tiny preset's) with a model of the tiny preset's tokenizer and
architecture (SmolLM2-135M, `--layers` of its 30) and random weights (benchmarks/random_base.py):
  - rollouts: sampled tokens/s of the RolloutEngine (the stage's transformers backend, which decodes this model with
    the lean decoder, with params/rl.yaml's chunk_tokens, through the agent loop), every episode of a step in one batch
    per decoding round, side by side with one episode at a time (the baseline);
  - update: tokens/s of the policy update (forward + backward of the clipped objective) on realistic multi-turn
    expert trajectories, micro-batches of 4 side by side with micro-batches of 1 (the baseline); and pi_old read off
    the update's own pass side by side with pi_old recomputed in a separate no-grad pass (the baseline);
  - a full trainer step (`train`, GRPO, SUM reward): the split between rollout, reward (strict evaluator) and update.

    python benchmarks/bench_rl.py --layers 2 --queries 2 --group-size 2 --steps 1 --rounds 1   # a quick run
    python benchmarks/bench_rl.py          # SmolLM2's full depth: far longer than the quick run's few minutes
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
from components.models.checkpoints import save_checkpoint
from components.params import read_yaml
from components.travel.expert import ExpertConfig, ExpertPolicy
from components.travel.queries import QueriesParams, synthesize_splits
from components.training.rl.engine import RolloutEngine
from components.training.rl.optim import TorchOptimizer
from components.training.rl.params import RLParams, RolloutParams
from components.training.rl.trainer import RLPaths, train
from components.training.rl.update import UpdateConfig, fill_logprobs, rollout_from_record, update_policy
from components.travel.tasks import dump_queries
from components.travel.synthetic import tiny_world_params, write_synthetic_world
from components.travel.source import TravelSource
from components.travel.world import World
from random_base import add_model_arguments, describe, random_base

ROOT = Path(__file__).resolve().parent.parent
# Episode limits of the rollout measurement (the trainer step: 3 turns of 64 tokens). A random-weight model's turn
# runs to the token limit, and a turn cut there ends its episode, so every episode is one turn of 64 sampled tokens.
TURNS, TOKENS_PER_TURN = 2, 64


def stage_rollout() -> RolloutParams:
    """The rl stage's rollout settings (params/rl.yaml): its chunk_tokens serve the benchmark's rollouts."""
    return RLParams.model_validate(read_yaml(ROOT / "params" / "rl.yaml")["rl"]).rollout


def expert_records(world, queries, tokenizer) -> list[dict]:
    """Multi-turn expert trajectories with token ids and masks (the loop encodes the expert's text turns)."""
    engine = RolloutEngine(ExpertPolicy(ExpertConfig(seed=0)), tokenizer, world, Limits(max_context_tokens=16384))
    return [r for group in engine.groups(queries, 1) for r in group]


def rollout_throughput(model, tokenizer, world, queries, group_size: int, max_batch_size: int | None,
                       rollout: RolloutParams) -> dict:
    from components.agent.hf import HFPolicy

    policy = HFPolicy(model, tokenizer, temperature=1.0, seed=0, max_batch_size=max_batch_size,
                      chunk_tokens=rollout.chunk_tokens)
    engine = RolloutEngine(policy, tokenizer, world, Limits(max_turns=TURNS, max_tokens_per_turn=TOKENS_PER_TURN,
                                                            max_context_tokens=8192))
    start = time.perf_counter()
    records = [r for group in engine.groups(queries, group_size) for r in group]
    wall = time.perf_counter() - start
    sampled = sum(sum(r["response_mask"]) for r in records)
    return {"episodes": len(records), "sampled": sampled, "wall": wall, "tokens_per_s": sampled / wall,
            "decoder": "lean" if policy.lean else "generate"}


def update_throughput(model, records, micro_batch_size: int, pad_id: int, separate_old_pass: bool = False) -> dict:
    """One GRPO update (one optimizer step, every weight trained) on `records`. `separate_old_pass`: the baseline
    that first recomputes pi_old in its own no-grad pass over every sequence instead of reading it off the update's
    forward pass. The model's weights are restored afterwards, so every call times the same update."""
    rng = random.Random(0)
    rollouts = [rollout_from_record(r, rng.choice([-1.0, 1.0])) for r in records]
    saved = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = TorchOptimizer(model, learning_rate=1e-5, weight_decay=0.0, max_grad_norm=1.0, scheduler="constant",
                               warmup_steps=0, total_steps=1)
    start = time.perf_counter()
    if separate_old_pass:
        fill_logprobs(model, rollouts, micro_batch_size, pad_id, 1.0, overwrite=True)
    config = UpdateConfig(micro_batch_size=micro_batch_size, recompute_old_logprobs=not separate_old_pass)
    stats = update_policy(model, optimizer, rollouts, config, pad_id)
    wall = time.perf_counter() - start
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(saved[name])
    model.eval()
    tokens = sum(len(r.input_ids) for r in rollouts)
    return {"tokens": tokens, "trained": stats["trained_tokens"], "wall": wall, "tokens_per_s": tokens / wall}


def fastest_of_alternated(first, second, rounds: int = 2) -> tuple[dict, dict]:
    """Run `first` and `second` alternately `rounds` times each; the fastest run of each (by "wall")."""
    a, b = [], []
    for _ in range(rounds):
        a.append(first())
        b.append(second())
    return min(a, key=lambda r: r["wall"]), min(b, key=lambda r: r["wall"])


TRAINER_QUERIES, TRAINER_GROUP, ENTROPY_COEFF = 2, 4, 1e-3


def trainer_steps(model_dir: Path, world_dir: Path, queries_path: Path, work: Path, steps: int,
                  rollout: RolloutParams) -> list[dict]:
    # A random-weight model earns no reward, so every group ties and GRPO alone would take no step (update 0 s); a
    # small entropy term in the loss gives the update a gradient, so the split is that of a step that trains.
    params = RLParams.model_validate({
        "device": "cpu", "max_steps": steps, "queries_per_step": TRAINER_QUERIES, "num_generations": TRAINER_GROUP,
        "micro_batch_size": 4, "entropy_coeff": ENTROPY_COEFF,
        "rollout": {"backend": "hf", "max_turns": 3, "max_tokens_per_turn": TOKENS_PER_TURN,
                    "max_context_tokens": 8192, "chunk_tokens": rollout.chunk_tokens}})
    paths = RLPaths(model=model_dir, world=world_dir, queries=queries_path, out=work / "out",
                    checkpoints=work / "ckpt", metrics=work / "rl.json", plots=work / "plots")
    logged: list[dict] = []
    train(params, paths, log=lambda metrics, step: logged.append(metrics), progress_bar=False)
    return [m for m in logged if "time/step_s" in m]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=8, help="RL queries of the rollout and update measurements")
    parser.add_argument("--group-size", type=int, default=4, help="samples per query in the rollout measurement")
    parser.add_argument("--steps", type=int, default=2, help="trainer steps (2 queries x 4 samples each)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="runs of each update variant, alternated with its pair; the fastest is kept")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    add_model_arguments(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rollout = stage_rollout()

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        write_synthetic_world(tiny_world_params(), tmp / "world")
        world = World.load(tmp / "world")
        source = TravelSource(world)  # what the engine rolls out
        splits, _ = synthesize_splits(world, QueriesParams(sizes={"sft": 0, "rl": args.queries, "val": 0}, days=(3,)),
                                      progress=False)
        queries = splits["rl"]
        dump_queries(queries, tmp / "rl.jsonl")

        tokenizer, model = random_base(args.layers, seed=0)
        records = expert_records(source, queries, tokenizer)
        save_checkpoint(model, tokenizer, tmp / "model", stage="bench")

        batched = rollout_throughput(model, tokenizer, source, queries, args.group_size, None, rollout)
        single = rollout_throughput(model, tokenizer, source, queries[: max(1, args.queries // 4)], args.group_size,
                                    1, rollout)
        pad_id = tokenizer.pad_token_id
        update_throughput(model, records, 4, pad_id)  # untimed warm-up: the first update pays one-off allocations
        # each pair alternated (A B A B ...) and the fastest of --rounds runs kept: the machines are noisy
        micro4, micro1 = fastest_of_alternated(
            lambda: update_throughput(model, records, 4, pad_id), lambda: update_throughput(model, records, 1, pad_id),
            args.rounds)
        reads, separate = fastest_of_alternated(
            lambda: update_throughput(model, records, 4, pad_id),
            lambda: update_throughput(model, records, 4, pad_id, separate_old_pass=True), args.rounds)
        steps = trainer_steps(tmp / "model", tmp / "world", tmp / "rl.jsonl", tmp / "run", args.steps, rollout)

    best = f"fastest of {args.rounds}, alternated" if args.rounds > 1 else "one run each"
    mean_len = sum(len(r["prompt_ids"]) + len(r["response_ids"]) for r in records) / len(records)
    print(f"Machine: {platform.processor() or platform.machine()} {platform.system()}, {os.cpu_count()} cores, "
          f"{args.threads} torch thread(s), Python {platform.python_version()}, torch {torch.__version__}, "
          f"{datetime.date.today()}.")
    print(f"Model: {describe(model, tokenizer)} (an untrained model rarely samples `<|im_end|>`: its first turn runs "
          f"to the {TOKENS_PER_TURN}-token limit, which ends the episode). {args.queries} RL queries of the tiny "
          f"world, G = {args.group_size}.")
    print()
    print(f"| rollouts ({batched['decoder']} decoder, chunk_tokens {rollout.chunk_tokens}, turns of at most "
          f"{TOKENS_PER_TURN} tokens) | episodes | sampled tokens | tokens/s | vs baseline |")
    print("|---|---:|---:|---:|---:|")
    print(f"| one episode at a time (baseline) | {single['episodes']} | {single['sampled']} | "
          f"{single['tokens_per_s']:.0f} | 1.00x |")
    print(f"| all {batched['episodes']} episodes of a step batched | {batched['episodes']} | {batched['sampled']} | "
          f"{batched['tokens_per_s']:.0f} | {batched['tokens_per_s'] / single['tokens_per_s']:.2f}x |")
    print()
    print(f"| update on {len(records)} expert trajectories (mean {mean_len:.0f} tokens; {best}) | "
          "tokens | seconds | tokens/s | vs baseline |")
    print("|---|---:|---:|---:|---:|")
    print(f"| micro-batch 1 (baseline) | {micro1['tokens']} | {micro1['wall']:.1f} | {micro1['tokens_per_s']:.0f} | "
          "1.00x |")
    print(f"| micro-batch 4 | {micro4['tokens']} | {micro4['wall']:.1f} | {micro4['tokens_per_s']:.0f} | "
          f"{micro4['tokens_per_s'] / micro1['tokens_per_s']:.2f}x |")
    print("(tokens/s counts every sequence token once; one update is one optimizer step, so pi_old is read off its own "
          "forward + backward pass.)")
    print()
    print(f"| update, micro-batch 4 ({best}) | seconds | vs baseline |")
    print("|---|---:|---:|")
    print(f"| pi_old recomputed in a separate no-grad pass (baseline) | {separate['wall']:.1f} | 1.00x |")
    print(f"| pi_old = the update pass's own detached log-probabilities | {reads['wall']:.1f} | "
          f"{separate['wall'] / reads['wall']:.2f}x |")
    print()
    print(f"| trainer step (GRPO, SUM, entropy_coeff {ENTROPY_COEFF:g}; {TRAINER_QUERIES} queries x {TRAINER_GROUP}) | "
          "sampled tokens | rollout s | reward s | update s | step s | rollout share |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for i, m in enumerate(steps, 1):
        print(f"| step {i} | {m['batch/sampled_tokens']:.0f} | {m['time/rollout_s']:.2f} | {m['time/reward_s']:.3f} | "
              f"{m['time/update_s']:.2f} | {m['time/step_s']:.2f} | {m['time/rollout_s'] / m['time/step_s']:.0%} |")
    print()
    print(json.dumps({"rollout": {"batched": batched, "single": single}, "update": {"micro4": micro4, "micro1": micro1,
                                                                                   "separate_old_pass": separate}},
                     indent=1))


if __name__ == "__main__":
    main()
