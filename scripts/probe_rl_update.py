"""Probe what one RL update does to the policy's likelihoods, before spending a 15-minute run on a recipe.

Rolls out `--train-queries + --held-out-queries` queries x G episodes with the RL stage's own parts (`build_parts`,
the rollout engine, the strict-evaluator rewards, group advantages), trains `--updates` times on the first
`--train-queries` queries' episodes (the stage's `update_policy`), and after each update prints how the mean
log-probability per sampled token moved for

  * the trained episodes with A > 0 and with A < 0 (GRPO should raise the first and lower the second), and
  * the held-out queries' episodes that delivered a plan (reward > 0) and those that did not: an update that
    transfers lowers the second more than the first; equal movement means it learnt nothing beyond its queries.

It also checks that the sampler's log-probabilities equal the trainer's recomputed ones (a mismatch would mean the
update trains a distribution other than the one sampled). Session 22 (docs/tiny_preset.md) used it to find why the
tiny preset's reward curve stays flat.

    python scripts/probe_rl_update.py --model models/sft                        # params/rl.yaml as it is
    python scripts/probe_rl_update.py --model models/sft --set learning_rate=2e-4 --set negative_advantage_weight=0
"""
from __future__ import annotations

import argparse
import copy
import random
import statistics
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse_value(text: str):
    """`--set key=value` values as YAML scalars (2e-4 -> float, seq-mean-token-mean -> str)."""
    value = yaml.safe_load(text)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def mean_or_nan(values: list[float]) -> float:
    return statistics.mean(values) if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=Path, default=Path("params/rl.yaml"))
    parser.add_argument("--model", type=Path, default=Path("models/sft"))
    parser.add_argument("--world", type=Path, default=Path("data/world"))
    parser.add_argument("--queries", type=Path, default=Path("data/queries/rl.jsonl"))
    parser.add_argument("--train-queries", type=int, default=2)
    parser.add_argument("--held-out-queries", type=int, default=2)
    parser.add_argument("--updates", type=int, default=2)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a top-level rl param (repeatable), e.g. learning_rate=2e-4")
    args = parser.parse_args(argv)

    import torch

    from components.training.rl import trainer as T
    from components.training.rl.params import RLParams
    from components.training.rl.update import rollout_from_record, sequence_logprobs, update_policy

    config = yaml.safe_load(args.params.read_text())["rl"]
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set {item!r}: use KEY=VALUE, e.g. learning_rate=2e-4")
        config[key] = parse_value(value)
    params = RLParams(**config)
    scratch = Path("/tmp/probe_rl_update")
    paths = T.RLPaths(args.model, args.world, args.queries, scratch / "out", scratch / "ckpt",
                      scratch / "metrics.json", scratch / "plots")
    world, queries = T.load_world_and_queries(paths)
    n_train, n_held = args.train_queries, args.held_out_queries
    if len(queries) < n_train + n_held:
        parser.error(f"{args.queries} holds {len(queries)} queries; the probe needs {n_train + n_held}")
    T.seed_everything(params.seed)
    parts = T.build_parts(params, paths, world, args.model, max(args.updates, 1), "cpu")
    parts.engine.begin_step(1)
    batch = T.collect_rollouts(parts.engine, queries[: n_train + n_held], lambda n: [], params, 0.0,
                               random.Random(params.seed))
    train_groups, held_groups = batch.groups[:n_train], batch.groups[n_train:]
    scored, advantages = T.step_advantages(train_groups, params.scale_rewards, params.negative_advantage_weight)
    trained = [rollout_from_record(s.record, a) for s, a in zip(scored, advantages)]
    held = [(rollout_from_record(s.record, 0.0), s.reward.total) for group in held_groups for s in group]
    model = parts.optimizer.model
    temperature = params.rollout.temperature

    def mean_logprob(rollout) -> float:
        ids = torch.tensor([rollout.input_ids])
        mask = torch.tensor([rollout.loss_mask], dtype=torch.float32)
        with torch.no_grad():
            logprobs, _ = sequence_logprobs(model, ids, temperature)
        return float((logprobs * mask).sum() / mask.sum().clamp(min=1))

    def mean_entropy(rollouts) -> float:
        """Mean entropy (nats) of the distributions that sampled the episodes' tokens."""
        total, count = 0.0, 0.0
        for rollout in rollouts:
            ids = torch.tensor([rollout.input_ids])
            mask = torch.tensor([rollout.loss_mask], dtype=torch.float32)
            with torch.no_grad():
                _, entropy = sequence_logprobs(model, ids, temperature, positions=mask, entropy_map=True)
            total, count = total + float((entropy * mask).sum()), count + float(mask.sum())
        return total / max(count, 1.0)

    gaps = []
    for rollout in trained:
        if rollout.old_logprobs is None:
            continue
        ids = torch.tensor([rollout.input_ids])
        with torch.no_grad():
            logprobs, _ = sequence_logprobs(model, ids, temperature)
        gaps += [abs(float(logprobs[0, t]) - rollout.old_logprobs[t]) for t, m in enumerate(rollout.loss_mask) if m]
    if gaps:
        gaps.sort()
        print(f"sampler vs trainer log-prob |diff| per token: median {gaps[len(gaps) // 2]:.2g}, "
              f"p99 {gaps[int(len(gaps) * 0.99)]:.2g}, max {gaps[-1]:.2g} ({len(gaps)} tokens)")
    print("trained rewards:", [round(s.reward.total, 3) for s in scored])
    print("advantages:     ", [round(a, 2) for a in advantages])
    before = [mean_logprob(r) for r in trained]
    held_before = [mean_logprob(r) for r, _ in held]
    held_rollouts = [r for r, _ in held]
    print(f"held-out entropy per sampled token before: {mean_entropy(held_rollouts):.4f} nats")
    print(f"{'update':>6} {'grad norm':>9} {'A>0':>8} {'A<0':>8} {'held-out delivered':>19} {'held-out failed':>16} "
          f"{'held-out H':>10}")
    for update in range(1, args.updates + 1):
        stats = update_policy(model, parts.optimizer, [copy.deepcopy(r) for r in trained], parts.update_config,
                              parts.pad_id)
        moved = [mean_logprob(r) - b for r, b in zip(trained, before)]
        held_moved = [mean_logprob(r) - b for (r, _), b in zip(held, held_before)]
        print(f"{update:>6} {stats.get('grad_norm', float('nan')):>9.3f} "
              f"{mean_or_nan([d for d, a in zip(moved, advantages) if a > 0]):>+8.4f} "
              f"{mean_or_nan([d for d, a in zip(moved, advantages) if a < 0]):>+8.4f} "
              f"{mean_or_nan([d for d, (_, r) in zip(held_moved, held) if r > 0]):>+19.4f} "
              f"{mean_or_nan([d for d, (_, r) in zip(held_moved, held) if r <= 0]):>+16.4f} "
              f"{mean_entropy(held_rollouts):>10.4f}")
    print("(mean change of log pi per sampled token, nats; nan: no episode of that kind)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
