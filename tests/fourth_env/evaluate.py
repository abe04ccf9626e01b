"""The lookup game's evaluation: the agent loop's evaluate callback and the share of correct answers."""
from __future__ import annotations

from fourth_env.reward import score


def evaluate(episode, record: dict) -> dict:
    return score(record, episode.meta["task"]["code"])


def accuracy(records: list[dict]) -> dict[str, float]:
    return {"correct": sum(bool((r.get("evaluation") or {}).get("correct")) for r in records) / max(len(records), 1)}


def summary(records: list[dict]) -> dict[str, float]:
    """rl.eval's row: the share of episodes that answered and the checks."""
    answered = sum(r.get("answer") is not None for r in records) / max(len(records), 1)
    return {"answered_rate": answered, **accuracy(records)}
