"""SFT records from any environment's expert: roll the expert of `env.kind` over every record of its task source
through the agent loop, keep each solved episode (a positive reward) once, as a chat record `star sft` trains on.

    records, metrics = expert_sft_records("toolstar", SourceInputs(tasks=..., files={...}), Limits(max_turns=8))

Assistant turns are trained unless the environment answered one with an error (`trained_turn`,
components/agent/environment.py); tool results stay user messages, masked out of the loss.
"""
from __future__ import annotations

from collections import Counter

from components import environments
from components.agent.environment import SourceInputs, trained_turn
from components.agent.loop import Limits, run_episodes
from components.synthesis.filter import estimate_counter, fingerprint, trajectory_tokens

def sft_record(record: dict, tokens: int) -> dict:
    """The chat-format SFT record of a finished episode (the sft_data stage's fields)."""
    messages = record["messages"]
    return {"idx": record["idx"], "level": record.get("level"), "num_tokens": tokens,
            "num_turns": record.get("num_turns"), "num_tool_calls": record.get("num_tool_calls"),
            "messages": [{"role": m["role"], "content": m["content"], "train": trained_turn(messages, i)}
                         for i, m in enumerate(messages)]}


def expert_sft_records(kind: str, inputs: SourceInputs, limits: Limits, seed: int = 0,
                       chars_per_token: float = 4.2) -> tuple[list[dict], dict]:
    """(records, metrics): the expert's solved episodes over the records of `kind`'s task source as SFT records,
    and the counts (`episodes`, `solved`, `kept`, `dropped`: unsolved and duplicate)."""
    source = environments.load_source(kind, inputs)
    episodes = [source.episode(item, seed=seed + i) for i, item in enumerate(source.items)]
    finished = run_episodes(episodes, environments.expert_policy(kind, seed), limits, evaluate=source.evaluate,
                            progress=False)
    count = estimate_counter(chars_per_token)
    kept, seen, dropped = [], set(), Counter()
    for record in finished:
        if source.reward(record, 1.0).value <= 0:
            dropped["unsolved"] += 1
        elif fingerprint(record) in seen:
            dropped["duplicate"] += 1
        else:
            seen.add(fingerprint(record))
            kept.append(sft_record(record, trajectory_tokens(record, count)))
    return kept, {"episodes": len(finished), "solved": len(finished) - dropped["unsolved"], "kept": len(kept),
                  "dropped": {"unsolved": dropped["unsolved"], "duplicate": dropped["duplicate"]}}
