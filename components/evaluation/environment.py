"""A checkpoint (or any policy) on any registered environment: its task source's records through the agent loop,
scored by the environment's own evaluation and reward.

    metrics = evaluate_checkpoint("qa", SourceInputs(tasks=..., files={"qa": ...}), "models/rl", DecodingParams(),
                                  Limits(max_turns=4))
"""
from __future__ import annotations

import statistics
from pathlib import Path

from components import environments
from components.agent.environment import SourceInputs
from components.agent.loop import Limits, run_episodes
from components.evaluation.policy import DecodingParams, load_checkpoint_policy


def episode_metrics(records: list[dict], rewards: list[float], checks: dict[str, float]) -> dict:
    """`n`, `mean_reward`, `solved_rate` (reward > 0), `answer_rate` and the environment's check rates."""
    n = len(records)
    return {"n": n, "mean_reward": statistics.fmean(rewards) if rewards else 0.0,
            "solved_rate": sum(r > 0 for r in rewards) / max(n, 1),
            "answer_rate": sum(r.get("termination") == "answer" for r in records) / max(n, 1), "checks": checks}


def evaluate_policy(kind: str, inputs: SourceInputs, policy, limits: Limits,
                    tokenizer=None) -> tuple[list[dict], dict]:
    """(records, metrics) of `policy` on every record of `kind`'s task source over `inputs`."""
    source = environments.load_source(kind, inputs)
    episodes = [source.episode(item, seed=i) for i, item in enumerate(source.items)]
    records = run_episodes(episodes, policy, limits, tokenizer=tokenizer, evaluate=source.evaluate, progress=False)
    rewards = [source.reward(record, 1.0).value for record in records]
    return records, episode_metrics(records, rewards, source.checks(records))


def evaluate_checkpoint(kind: str, inputs: SourceInputs, model: str | Path, decoding: DecodingParams,
                        limits: Limits) -> dict:
    """The metrics of a checkpoint's episodes (greedy by default) on `kind`'s task source."""
    policy, tokenizer = load_checkpoint_policy(model, decoding, limits.max_context_tokens)
    return evaluate_policy(kind, inputs, policy, limits, tokenizer=tokenizer)[1]
