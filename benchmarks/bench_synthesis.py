"""Benchmark synthesis: query synthesis rate, environment overhead per step, expert trajectories per second.

On the tiny synthetic world (the `tiny` preset's world):
  - queries: accepted queries per second of `synthesize_splits` (skeleton, budget, prechecks, solver proof, text);
  - trajectories: the expert through the environment and the agent loop (with both evaluator modes), batched in
    lockstep (64 episodes per policy call) side by side with one episode at a time, and with the solver alone
    (direct tool calls, no chat protocol, no evaluation) as the floor;
  - per step: time inside `env.step` (protocol parse + tool + rendering), inside the expert policy, and what the
    loop itself adds (record keeping, requests), per assistant turn.

    python benchmarks/bench_synthesis.py                # 300 queries, about a minute on 2 cores
    python benchmarks/bench_synthesis.py --queries 100  # quick
"""
from __future__ import annotations

import argparse
import platform
import tempfile
import time
from pathlib import Path

from components.agent.loop import Limits, run_episodes
from components.travel.env import travel_episodes
from components.travel.evaluate import travel_evaluate
from components.travel.expert import ExpertConfig, ExpertPolicy, solve_with_tools
from components.travel.queries import QueriesParams, synthesize_splits
from components.travel.synthetic import tiny_world_params, write_synthetic_world
from components.travel.world import World


class Timed:
    """Wraps a callable and accumulates its wall time and call count."""

    def __init__(self, fn):
        self.fn, self.seconds, self.calls = fn, 0.0, 0

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start
            self.calls += 1


def rollout(world: World, queries: list, batch_size: int) -> dict:
    """Expert trajectories through the loop, timing env steps, policy calls and evaluation separately."""
    policy = ExpertPolicy(ExpertConfig(seed=0))
    generate = Timed(policy.generate)
    policy.generate = generate
    evaluate = Timed(travel_evaluate(world))
    steps = Timed(None)  # totals over every episode's timed env.step
    records = []
    start = time.perf_counter()
    for first in range(0, len(queries), batch_size):
        episodes = travel_episodes(world, queries[first:first + batch_size])
        for episode in episodes:
            episode.env.step = Timed(episode.env.step)
        records += run_episodes(episodes, policy, Limits(), evaluate=evaluate, progress=False)
        for episode in episodes:
            steps.seconds += episode.env.step.seconds
            steps.calls += episode.env.step.calls
    wall = time.perf_counter() - start
    turns = sum(r["num_turns"] for r in records)
    loop = wall - steps.seconds - generate.seconds - evaluate.seconds
    return {
        "trajectories": len(records), "turns": turns, "wall": wall,
        "traj_per_s": len(records) / wall, "env_us_per_step": 1e6 * steps.seconds / steps.calls,
        "policy_us_per_turn": 1e6 * generate.seconds / turns, "eval_ms_per_traj": 1e3 * evaluate.seconds / len(records),
        "loop_us_per_turn": 1e6 * loop / turns, "policy_calls": generate.calls,
        "pass": sum(r["evaluation"]["strict"]["final_pass"] for r in records) / len(records),
    }


def solver_only(world: World, queries: list) -> dict:
    start = time.perf_counter()
    actions = 0
    for query in queries:
        _, trace = solve_with_tools(world, query, ExpertConfig(seed=0))
        actions += len(trace)
    wall = time.perf_counter() - start
    return {"traj_per_s": len(queries) / wall, "wall": wall, "turns": actions}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        write_synthetic_world(tiny_world_params(), Path(tmp) / "world")
        world = World.load(Path(tmp) / "world")
    start = time.perf_counter()
    splits, summary = synthesize_splits(world, QueriesParams(sizes={"sft": args.queries, "rl": 0, "val": 0}),
                                        progress=False)
    synth_wall = time.perf_counter() - start
    queries = splits["sft"]
    batched = rollout(world, queries, batch_size=64)
    single = rollout(world, queries, batch_size=1)
    floor = solver_only(world, queries)

    print(f"machine: {platform.machine()} {platform.system()}, Python {platform.python_version()}")
    print(f"queries: {len(queries)} accepted of {summary['attempts']} skeletons in {synth_wall:.2f} s "
          f"= {len(queries) / synth_wall:.1f} queries/s")
    print(f"mean turns per trajectory: {batched['turns'] / batched['trajectories']:.1f}; strict pass "
          f"{batched['pass']:.1%}")
    print("| variant | trajectories/s | vs one at a time |")
    print("|---|---:|---:|")
    for name, row in (("loop, one episode at a time (baseline)", single), ("loop, 64 in lockstep", batched),
                      ("solver alone (direct tool calls, no protocol, no evaluation)", floor)):
        print(f"| {name} | {row['traj_per_s']:.1f} | {row['traj_per_s'] / single['traj_per_s']:.2f}x |")
    print("| per step (64 in lockstep) | microseconds |")
    print("|---|---:|")
    print(f"| env.step (parse + tool + render) | {batched['env_us_per_step']:.0f} |")
    print(f"| expert policy, per turn | {batched['policy_us_per_turn']:.0f} |")
    print(f"| loop bookkeeping, per turn | {batched['loop_us_per_turn']:.0f} |")
    print(f"| evaluation (strict + official), per trajectory | {1000 * batched['eval_ms_per_traj']:.0f} |")


if __name__ == "__main__":
    main()
