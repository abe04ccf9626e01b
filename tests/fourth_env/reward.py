"""The lookup game's reward: 1 for the right code, else 0; no answer is the format failure."""
from __future__ import annotations

from components.agent.environment import TaskReward


def score(record: dict, code: str) -> dict:
    return {"correct": (record.get("answer") or "").strip() == code}


def task_reward(record: dict) -> TaskReward:
    correct = float((record.get("evaluation") or {}).get("correct", False))
    return TaskReward(value=correct, kind="lookup", components={"success": correct},
                      format_applied=record.get("answer") is None)
