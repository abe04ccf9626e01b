"""The base_model stage's work: the tiny base built from scratch (tokenizer, model, QA pre-training), or a
pretrained checkpoint snapshotted. I/O stays in `commands.py`; these functions take and return data."""
from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator
from pathlib import Path

from components.errors import UserError

QA_PRETRAIN_FILE = "pretrain.jsonl"


def chat_texts(records: Iterable[dict]) -> Iterator[str]:
    """Every message content of chat records (the tokenizer's training corpus)."""
    for record in records:
        for message in record.get("messages", []):
            yield message["content"]


def tokenizer_texts(records: Iterable[dict]) -> Iterator[str]:
    """The tokenizer's training corpus: every message content, without the unknown-city hints and the running-plan
    ledgers (`filter.ledger`, the same text again). A hint repeats city
    names and a fixed phrase; leaving it out keeps the vocabulary the one measured before hints existed, so the
    tiny base (whose copy warm-up is a coin flip of the exact token ids) stays the measured one
    (docs/tiny_preset.md, session 9)."""
    from components.synthesis.ledger import without_ledger
    from components.travel.tools import without_city_hints

    return (without_ledger(without_city_hints(text)) for text in chat_texts(records))


def read_jsonl(path: Path) -> list[dict]:
    """Records of a JSONL file (blank lines skipped)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def corpus_records(corpus_dir: str | Path) -> list[dict]:
    """The chat records of every `*.jsonl` in `corpus_dir` (data/sft: train and eval)."""
    corpus_dir = Path(corpus_dir)
    files = sorted(corpus_dir.glob("*.jsonl")) if corpus_dir.is_dir() else []
    if not files:
        raise UserError(f"no SFT records in {corpus_dir} (expected train.jsonl/eval.jsonl): run the sft_data "
                        "stage first (`dvc repro sft_data`)")
    return [record for path in files for record in read_jsonl(path)]


def qa_pretrain_records(qa_dir: str | Path) -> list[dict]:
    """The QA expert trajectories for pre-training (`<qa_dir>/pretrain.jsonl`); a clear error when absent."""
    path = Path(qa_dir) / QA_PRETRAIN_FILE
    if not path.exists():
        raise UserError(f"{path} does not exist: the tiny base is pre-trained on the QA-with-search trajectories. "
                        "Run the qa_data stage first (`dvc repro qa_data`, or `star qa build --params "
                        f"params/ood_qa.yaml --out {qa_dir}`)")
    records = read_jsonl(path)
    if not records:
        raise UserError(f"{path} holds no records: rebuild it with the qa_data stage")
    return records


def split_holdout(records: list[dict], fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, held out): a seeded random `fraction` of the records held out (at least one when fraction > 0)."""
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    n_out = max(1, round(fraction * len(records))) if fraction > 0 and len(records) > 1 else 0
    held = set(order[:n_out])
    return [r for i, r in enumerate(records) if i not in held], [r for i, r in enumerate(records) if i in held]


def tokens_per_record(tokenizer, records: list[dict]) -> float:
    """Mean number of tokens of a record's message contents (how compact the tokenizer is on this corpus)."""
    if not records:
        return 0.0
    return sum(len(tokenizer.encode(text, add_special_tokens=False)) for text in chat_texts(records)) / len(records)
