"""QA pre-training records for the tiny base model: QA expert trajectories as chat records with `train` flags.

The base model learns the protocol and in-context copying (reading an answer out of retrieved passages) from these;
only assistant messages are trained on (`train: true`), the system prompt, question and tool responses are context.
"""
from __future__ import annotations


def chat_record(record: dict) -> dict:
    """A finished QA trajectory as a pre-training record: messages with per-message `train` flags."""
    messages = [{"role": m["role"], "content": m["content"], "train": m["role"] == "assistant"}
                for m in record["messages"]]
    return {"id": record.get("id"), "dataset": record.get("dataset"), "source": "qa_expert",
            "messages": messages, "answer": record.get("answer"), "golden_answers": record.get("golden_answers"),
            "evaluation": record.get("evaluation")}


def pretrain_records(trajectories: list[dict], successful_only: bool = True) -> list[dict]:
    """Chat records from expert trajectories; by default only those that ended with an exact-match answer."""
    keep = [t for t in trajectories
            if not successful_only or (t.get("termination") == "answer" and (t.get("evaluation") or {}).get("em"))]
    return [chat_record(t) for t in keep]
