"""The sft_data stage: keep the trajectories worth imitating and turn them into chat-format SFT records.

A trajectory is kept when it ended with an answer, made no protocol error, passed the strict evaluator's final
check, fits the token and turn limits, and is not a duplicate of one already kept. The first failed rule is the
drop reason. Token counts come from a tokenizer when one is configured, else from a chars-per-token estimate
(`len(text) / chars_per_token`; about 4 for English BPE vocabularies).
"""
from __future__ import annotations

import hashlib
import json
import math
import random
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from pydantic import Field
from transformers import AutoTokenizer

from components.agent.environment import trained_turn
from components.errors import UserError
from components.jsonl import iter_jsonl
from components.models.chat_format import render_message
from components.params import Params

DROP_REASONS = ("not_answered", "protocol_errors", "failed_strict", "too_many_turns", "too_long", "duplicate")


class FilterParams(Params):
    """`params/filter.yaml`, section `filter`."""

    max_tokens: int = Field(16384, ge=1)
    max_turns: int = Field(60, ge=1)
    chars_per_token: float = Field(3.5, gt=0)
    tokenizer: str | None = None  # a Hugging Face tokenizer folder; None uses the chars-per-token estimate
    eval_fraction: float = Field(0.1, ge=0, lt=1)
    seed: int = 0


def estimate_counter(chars_per_token: float) -> Callable[[str], int]:
    """Token count estimated from characters (ceil(len / chars_per_token))."""
    return lambda text: math.ceil(len(text) / chars_per_token)


def tokenizer_counter(tokenizer: Any) -> Callable[[str], int]:
    """Exact token count with a tokenizer (`encode(text, add_special_tokens=False)`)."""
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False))


def trajectory_tokens(record: dict, count: Callable[[str], int]) -> int:
    """Tokens of the whole trajectory: its own token ids when it carries them, else the rendered chat counted."""
    if record.get("prompt_ids") is not None and record.get("response_ids") is not None:
        return len(record["prompt_ids"]) + len(record["response_ids"])
    return int(sum(count(render_message(m)) for m in record["messages"]))


def fingerprint(record: dict) -> str:
    """Two trajectories are duplicates when their conversations are identical."""
    text = json.dumps([[m["role"], m["content"]] for m in record["messages"]], ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def drop_reason(record: dict, tokens: int, params: FilterParams) -> str | None:
    """Why a trajectory is dropped (the first rule it breaks), or None to keep it (duplicates aside)."""
    if record.get("termination") != "answer" or not record.get("plan"):
        return "not_answered"
    if record.get("num_protocol_errors", 0) > 0:
        return "protocol_errors"
    if not ((record.get("evaluation") or {}).get("strict") or {}).get("final_pass"):
        return "failed_strict"
    if record.get("num_turns", 0) > params.max_turns:
        return "too_many_turns"
    if tokens > params.max_tokens:
        return "too_long"
    return None


def sft_record(record: dict, tokens: int) -> dict:
    """The chat-format SFT record: messages with `train` from `trained_turn` (an assistant turn the environment did
    not answer with an error: the slip, not the recovery, is left untrained), plus the trajectory's own token ids and
    mask when it carries them (the mask as sampled: SFT builds its own from the messages)."""
    messages = record["messages"]
    out = {
        "idx": record["idx"],
        "level": record.get("level"),
        "messages": [{"role": m["role"], "content": m["content"], "train": trained_turn(messages, i)}
                     for i, m in enumerate(messages)],
        "num_tokens": tokens,
        "num_turns": record.get("num_turns"),
        "num_tool_calls": record.get("num_tool_calls"),
    }
    for key in ("prompt_ids", "response_ids", "response_mask"):
        if record.get(key) is not None:
            out[key] = record[key]
    return out


def filter_trajectories(records: list[dict], params: FilterParams,
                        count: Callable[[str], int]) -> tuple[list[dict], dict]:
    """The kept SFT records and the statistics (kept/dropped by reason and by level)."""
    kept, seen = [], set()
    dropped: Counter = Counter()
    by_level: dict[str, Counter] = {}
    for record in records:
        tokens = trajectory_tokens(record, count)
        reason = drop_reason(record, tokens, params)
        if reason is None:
            key = fingerprint(record)
            reason = "duplicate" if key in seen else None
            seen.add(key)
        level = by_level.setdefault(str(record.get("level")), Counter())
        if reason:
            dropped[reason] += 1
            level["dropped"] += 1
            level[reason] += 1
        else:
            kept.append(sft_record(record, tokens))
            level["kept"] += 1
    stats = {
        "input": len(records),
        "kept": len(kept),
        "keep_rate": len(kept) / len(records) if records else 0.0,
        "dropped": {reason: dropped.get(reason, 0) for reason in DROP_REASONS},
        "by_level": {level: dict(counts) for level, counts in sorted(by_level.items())},
        "mean_tokens": sum(r["num_tokens"] for r in kept) / len(kept) if kept else 0.0,
        "max_tokens": max((r["num_tokens"] for r in kept), default=0),
    }
    return kept, stats


def split_train_eval(records: list[dict], eval_fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """Seeded shuffle, then the first `round(n * eval_fraction)` (at least 1 when the fraction is positive and
    there are two or more records) go to eval."""
    shuffled = list(records)
    random.Random(seed).shuffle(shuffled)
    n_eval = round(len(shuffled) * eval_fraction)
    if eval_fraction > 0 and n_eval == 0 and len(shuffled) >= 2:
        n_eval = 1
    return shuffled[n_eval:], shuffled[:n_eval]


def write_jsonl(records: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")


def read_jsonl(path: Path) -> list[dict]:
    """Trajectory records of a JSONL file; a malformed line is an error naming the file and line."""
    records = []
    for number, record in iter_jsonl(path, missing_hint="run the teacher first: `dvc repro trajectories`"):
        if not isinstance(record, dict):
            raise UserError(f"{path}:{number}: a trajectory record is a JSON object, got {type(record).__name__}")
        records.append(record)
    return records


def load_counter(params: FilterParams) -> tuple[Callable[[str], int], str]:
    """The token counter and its description for the metrics."""
    if params.tokenizer:
        if not Path(params.tokenizer).exists():
            raise UserError(f"filter.tokenizer {params.tokenizer} does not exist; set it to a tokenizer folder "
                            "or to null to use the chars-per-token estimate")
        return tokenizer_counter(AutoTokenizer.from_pretrained(params.tokenizer)), f"tokenizer:{params.tokenizer}"
    return estimate_counter(params.chars_per_token), f"estimate:{params.chars_per_token} chars/token"
