"""Real RL steps on a GPU: plain torch AdamW (baseline) against accelerate + DeepSpeed ZeRO-2, side by side.

Two parts, both printed as one table (and written to `--out/bench_rl_gpu.json`):

1. The tiny preset's SFT checkpoint (SmolLM2-135M-Instruct after the sft stage) through the whole RL loop
   (`components.training.rl.trainer.train`: transformers rollouts on the GPU, the strict evaluator's SUM reward, GRPO
   update, checkpoint), `--steps` steps per optimiser.
2. `--qwen-shape`: a Qwen2-architecture model with Qwen2.5-0.5B's shape (24 layers, hidden 896, 14 heads, 2 KV heads,
   MLP 4864; random weights over the SFT checkpoint's tokenizer, SmolLM2's) for throughput at a realistic size: real
   rollouts through the RL engine, then one update per optimiser. A random-weight model earns no reward (every group
   ties, and a tied group's advantage is 0, so nothing would train): this part gives the trajectories advantages
   drawn from a seeded normal distribution and says so in its rows.

vLLM rollouts are not part of it: they need the `vllm` package (the [gpu] extra) on the machine.

    python benchmarks/bench_rl_gpu.py --steps 2 --qwen-shape --out /tmp/bench_rl_gpu   # after `dvc repro sft`

Meant for a CUDA machine. On a CPU it runs too, slowly (params/rl.yaml's rollouts and, with --qwen-shape, a 0.5B
model in fp32); DeepSpeed needs `pip install deepspeed` there as well.
"""
from __future__ import annotations

import argparse
import copy
import datetime
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from components.params import read_yaml
from components.training.rl.params import RLParams
from components.training.rl.trainer import RLPaths, train

QWEN25_05B_SHAPE = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                        intermediate_size=4864, max_position_embeddings=32768, rope_theta=1_000_000.0,
                        tie_word_embeddings=True)


def qwen_shape_model(tokenizer, seed: int = 0, shape: dict | None = None):
    """A float32 Qwen2 causal LM of `shape` (default QWEN25_05B_SHAPE) over `tokenizer`'s vocabulary, random weights,
    stopping at `<|im_end|>`."""
    from transformers import Qwen2Config

    from components.models.factory import random_model
    from components.models.loading import end_of_turn_id

    end_id = end_of_turn_id(tokenizer)
    config = Qwen2Config(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, eos_token_id=end_id,
                         pad_token_id=tokenizer.pad_token_id, **(QWEN25_05B_SHAPE if shape is None else shape))
    model = random_model(config, seed=seed)
    model.generation_config.eos_token_id = end_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def merged(base: dict, overrides: dict) -> dict:
    """`base` with `overrides` merged in, nested dictionaries key by key."""
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        out[key] = merged(out.get(key) or {}, value) if isinstance(value, dict) else value
    return out


def rl_params(params_file: Path, overrides: dict) -> RLParams:
    return RLParams.model_validate(merged(read_yaml(params_file)["rl"], overrides))


def peak_memory_gib(device: str) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None


def reset_peak_memory(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def full_loop(label: str, params: RLParams, model: Path, world: Path, queries: Path, work: Path,
              device: str) -> dict:
    """`--steps` real RL steps of the trainer from `model`; the per-step means of what it logged."""
    reset_peak_memory(device)
    logged: list[dict] = []
    run_dir = work / label.replace(" ", "_").replace("+", "")
    paths = RLPaths(model=model, world=world, queries=queries, out=run_dir / "model", checkpoints=run_dir / "ckpt",
                    metrics=run_dir / "rl.json", plots=run_dir / "plots")
    start = time.perf_counter()
    summary = train(params, paths, log=lambda metrics, step: logged.append(metrics), progress_bar=False)
    wall = time.perf_counter() - start

    def mean(key: str) -> float:
        return statistics.fmean(m.get(key, 0.0) for m in logged)

    return {"run": label, "model": "tiny preset's SFT checkpoint", "steps": len(logged), "wall_s": wall,
            "step_s": mean("time/step_s"), "rollout_s": mean("time/rollout_s"), "reward_s": mean("time/reward_s"),
            "update_s": mean("time/update_s"), "rollout_tok_s": summary["rollout_tokens_per_s"],
            "update_tok_s": summary["update_tokens_per_s"], "sampled_tokens": mean("batch/sampled_tokens"),
            "reward": mean("reward/mean"), "delivered": mean("episode/delivered"),
            "optimizer_steps": sum(m.get("policy/optimizer_steps", 0) for m in logged),
            "peak_gib": peak_memory_gib(device), "advantages": "GRPO (real rewards)"}


def qwen_shape_step(label: str, params: RLParams, tokenizer_dir: Path, world_dir: Path, queries_file: Path,
                    device: str, num_queries: int) -> dict:
    """Rollouts of a Qwen2.5-0.5B-shaped model through the RL engine, then one update (seeded synthetic
    advantages: a random-weight model earns no reward)."""
    from components.agent.loop import Limits
    from components.models.factory import count_parameters
    from components.models.loading import load_tokenizer
    from components.training.rl.engine import RolloutEngine
    from components.training.rl.rollout_backends import PolicyInputs, rollout_backend, rollout_sampling
    from components.training.rl.strategies import build_optimizer
    from components.training.rl.update import UpdateConfig, rollout_from_record, update_policy
    from components.travel.tasks import load_queries
    from components.travel.world import World

    reset_peak_memory(device)
    tokenizer = load_tokenizer(tokenizer_dir)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = qwen_shape_model(tokenizer, seed=0).to(device=device, dtype=dtype)
    size = count_parameters(model)
    optimizer = build_optimizer(model, params, total_steps=1)
    rollout = params.rollout
    sampling = rollout_sampling(rollout, params.seed, dtype=str(dtype).removeprefix("torch."))
    policy = rollout_backend(rollout.backend, device).build(PolicyInputs(optimizer.unwrap(), tokenizer,
                                                                         str(tokenizer_dir), sampling, device))
    engine = RolloutEngine(policy, tokenizer, World.load(world_dir),
                           Limits(max_turns=rollout.max_turns, max_tokens_per_turn=rollout.max_tokens_per_turn,
                                  max_context_tokens=rollout.max_context_tokens,
                                  max_protocol_errors=rollout.max_protocol_errors), seed=params.seed)
    engine.begin_step(1)
    start = time.perf_counter()
    records = [r for group in engine.groups(load_queries(queries_file)[:num_queries], params.num_generations)
               for r in group]
    rollout_s = time.perf_counter() - start
    sampled = sum(sum(r["response_mask"]) for r in records)
    generator = torch.Generator().manual_seed(0)
    advantages = torch.randn(len(records), generator=generator).tolist()
    rollouts = [rollout_from_record(r, a) for r, a in zip(records, advantages)]
    config = UpdateConfig(micro_batch_size=params.micro_batch_size, temperature=rollout.temperature)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    start = time.perf_counter()
    stats = update_policy(optimizer.model, optimizer, rollouts, config, pad_id)
    update_s = time.perf_counter() - start
    return {"run": label, "model": f"Qwen2.5-0.5B shape ({size / 1e6:.0f}M, random)", "steps": 1,
            "wall_s": rollout_s + update_s, "step_s": rollout_s + update_s, "rollout_s": rollout_s, "reward_s": 0.0,
            "update_s": update_s, "rollout_tok_s": sampled / rollout_s,
            "update_tok_s": stats["processed_tokens"] / update_s, "sampled_tokens": sampled, "reward": None,
            "delivered": None, "optimizer_steps": stats["optimizer_steps"], "peak_gib": peak_memory_gib(device),
            "advantages": "synthetic N(0,1)"}


def table(rows: list[dict], device_name: str, warmup_note: str) -> str:
    lines = [f"\n### RL steps on {device_name} (`bench_rl_gpu.py`, {datetime.date.today()})\n",
             f"torch {torch.__version__}, python {platform.python_version()}; {warmup_note}.\n",
             "| run | model | steps | s/step | rollout / reward / update s | rollout tok/s | update tok/s | "
             "reward | delivered | peak GiB | advantages |",
             "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---|"]

    def fmt(value, spec):
        return "-" if value is None else format(value, spec)

    for r in rows:
        lines.append(f"| {r['run']} | {r['model']} | {r['steps']} | {r['step_s']:.1f} | {r['rollout_s']:.1f} / "
                     f"{r['reward_s']:.2f} / {r['update_s']:.2f} | {r['rollout_tok_s']:.0f} | {r['update_tok_s']:.0f} "
                     f"| {fmt(r['reward'], '.3f')} | {fmt(r['delivered'], '.2f')} | {fmt(r['peak_gib'], '.2f')} | "
                     f"{r['advantages']} |")
    by_model: dict[str, dict[str, dict]] = {}
    for r in rows:
        by_model.setdefault(r["model"], {})[r["run"].split(" ")[0]] = r
    for model, runs in by_model.items():
        if "torch" in runs and "deepspeed" in runs and runs["torch"]["update_tok_s"] > 0:
            t, d = runs["torch"], runs["deepspeed"]
            lines.append(f"\n{model}: DeepSpeed ZeRO-2 / torch AdamW update tokens/s = "
                         f"{d['update_tok_s'] / t['update_tok_s']:.2f}x")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params/rl.yaml", type=Path)
    parser.add_argument("--model", default="models/sft", type=Path)
    parser.add_argument("--world", default="data/world", type=Path)
    parser.add_argument("--queries", default="data/queries/rl.jsonl", type=Path)
    parser.add_argument("--steps", type=int, default=2, help="RL steps per optimiser on the tiny checkpoint")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--optimizers", nargs="+", default=["torch", "deepspeed"], choices=["torch", "deepspeed"])
    parser.add_argument("--qwen-shape", action="store_true", help="also a Qwen2.5-0.5B-shaped model (part 2)")
    parser.add_argument("--qwen-queries", type=int, default=2, help="queries (x 4 samples) of part 2")
    parser.add_argument("--qwen-tokens-per-turn", type=int, default=512, help="turn budget of part 2")
    parser.add_argument("--out", type=Path, default=None, help="folder for bench_rl_gpu.json (default: a temp dir)")
    parser.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=None,
                        help="run each part once untimed first (default: on for CUDA, where transformers compiles "
                             "the static-cache decode step into CUDA graphs on first use, which would otherwise be "
                             "charged to whichever optimiser runs first)")
    args = parser.parse_args()
    for path in (args.model, args.world, args.queries, args.params):
        if not path.exists():
            sys.exit(f"{path} does not exist: build the tiny preset's SFT checkpoint first (`dvc repro sft`)")
    if "deepspeed" in args.optimizers and importlib.util.find_spec("deepspeed") is None:
        sys.exit("--optimizers deepspeed needs the deepspeed package (pip install 'star-pipeline[gpu]')")
    if "deepspeed" in args.optimizers:  # DeepSpeed trains in a launcher's world: run this script under torchrun
        from components.training import launch

        command = launch.launch_command(sys.argv[1:], os.environ, 1, target=[__file__])
        if command is not None:
            sys.exit(launch.run(command, "bench_rl_gpu"))

    from components.models.loading import resolve_device

    device = resolve_device(args.device)
    device_name = torch.cuda.get_device_name() if device.startswith("cuda") else f"CPU ({platform.machine()})"
    work = Path(tempfile.mkdtemp(prefix="bench_rl_gpu_"))
    strategy = {"torch": {"strategy": "none"}, "deepspeed": {"strategy": "deepspeed", "zero_stage": 2}}
    warmup = device.startswith("cuda") if args.warmup is None else args.warmup

    def loop_params(name: str, steps: int) -> RLParams:
        return rl_params(args.params, {"device": device, "max_steps": steps, "max_minutes": None,
                                       "rollout": {"backend": "hf"}, "distributed": strategy[name]})

    def qwen_params(name: str) -> RLParams:
        return rl_params(args.params, {
            "device": device, "num_generations": 4, "micro_batch_size": 4, "distributed": strategy[name],
            "rollout": {"backend": "hf", "max_turns": 4, "max_tokens_per_turn": args.qwen_tokens_per_turn}})

    if warmup:
        print(json.dumps({"warm-up (not in the table)": full_loop(
            "warm-up", loop_params("torch", 1), args.model, args.world, args.queries, work, device)}), flush=True)
    rows = []
    for name in args.optimizers:
        rows.append(full_loop(f"{name} + transformers rollouts", loop_params(name, args.steps), args.model,
                              args.world, args.queries, work, device))
        print(json.dumps(rows[-1]), flush=True)
    if args.qwen_shape:
        if warmup:
            print(json.dumps({"warm-up (not in the table)": qwen_shape_step(
                "warm-up", qwen_params("torch"), args.model, args.world, args.queries, device,
                args.qwen_queries)}), flush=True)
        for name in args.optimizers:
            rows.append(qwen_shape_step(f"{name} + transformers rollouts", qwen_params(name), args.model,
                                        args.world, args.queries, device, args.qwen_queries))
            print(json.dumps(rows[-1]), flush=True)
    text = table(rows, device_name, "each part ran once untimed first" if warmup else "no warm-up")
    print(text)
    out = args.out or work
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_rl_gpu.json").write_text(json.dumps({"device": device_name, "rows": rows}, indent=1))
    (out / "bench_rl_gpu.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
