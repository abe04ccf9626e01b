"""How well a model copies listing names from tool results, measured teacher-forced on chat records.

A plan passes the strict within-sandbox check only when every restaurant, attraction and accommodation in it is a
name the tools returned, copied exactly. A tiny policy gets some of a name right and guesses the rest: after the
first syllable of "Kaga Suite" it writes " Studio"; after "Renrenvi" it writes " Table", the commonest restaurant
kind (docs/tiny_preset.md, session 35). So this probe scores each copied name by part:

- `first`: the name's first token, the choice of which listing (the look-up);
- `middle`: the tokens between the first one and the last word (the rest of a coined name's syllables);
- `last_word`: the tokens of the last word when the name has more than one ("Suite", "Table", "Gardens": in the
  synthetic world the listing kind, which is where a policy falls back on its prior);
- `whole`: names whose every token is predicted right.

`lookup` scores the same parts over first occurrences only: the first time a record's trained turns write a name,
the only place to copy it from is the tool result (the look-up); later occurrences can copy the agent's own earlier
text, which a model does far more easily. For the shipped tiny SFT checkpoint the two differ by 6x on the first token
(docs/tiny_preset.md, session 36), so the look-up is the number to watch.

A copied name is an occurrence, in a trained assistant turn, of a name that an earlier tool result of the same
record listed (`components.travel.tools.listing_names`). The sft stage reports it as `name_copy_accuracy` in
`metrics/sft.json`.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from components.agent import tokens as tok
from components.training.sft import encode_segments
from components.travel.tools import listing_names

NAME_PARTS = ("first", "middle", "last_word", "whole")


@dataclass(frozen=True)
class CopiedName:
    """One occurrence of a shown name in a trained turn: its token positions in the record's ids, by part."""

    name: str
    first: int
    middle: tuple[int, ...] = ()
    last_word: tuple[int, ...] = ()
    lookup: bool = False  # the record's first trained occurrence of the name: copied from a tool result

    @property
    def positions(self) -> tuple[int, ...]:
        return (self.first, *self.middle, *self.last_word)


def _occurrences(text: str, names: Sequence[str]) -> list[tuple[int, str]]:
    """(start, name) for each name in `text` as a whole word, longest first where two overlap."""
    found = []
    for name in sorted(set(names), key=len, reverse=True):
        for match in re.finditer(rf"(?<![A-Za-z]){re.escape(name)}(?![A-Za-z])", text):
            if all(match.end() <= start or match.start() >= start + len(other) for start, other in found):
                found.append((match.start(), name))
    return sorted(found)


def _split_by_part(name: str, start: int, offsets: list[tuple[int, int]], base: int) -> CopiedName | None:
    """The positions of the tokens that overlap `text[start:start + len(name)]`, split into the name's parts."""
    end = start + len(name)
    positions = [i for i, (a, b) in enumerate(offsets) if b > start and a < end]
    if not positions:
        return None
    last_word_start = start + name.rfind(" ") if " " in name else end
    first, rest = positions[0], positions[1:]
    middle = tuple(base + i for i in rest if offsets[i][0] < last_word_start)
    last_word = tuple(base + i for i in rest if offsets[i][0] >= last_word_start)
    return CopiedName(name, base + first, middle, last_word)


def copied_names(tokenizer, messages: list[dict]) -> tuple[list[int], list[CopiedName]]:
    """The record's token ids (as `encode_record` builds them) and every copied name in its trained turns. Names are
    found through character offsets, so a tokenizer without them (a slow, pure-Python one) finds none."""
    ids: list[int] = []
    offsets_available = getattr(tokenizer, "is_fast", False)
    shown: list[str] = []
    found: list[CopiedName] = []
    written: set[str] = set()
    for message, segment, trained in encode_segments(tokenizer, messages):
        if message is not None and message["role"] == "user":
            shown += listing_names(message["content"])
        elif message is not None and trained and shown and offsets_available:
            text = message["content"] + tok.IM_END
            encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            if list(encoded["input_ids"]) == segment:  # the same ids, now with character offsets
                offsets = [tuple(pair) for pair in encoded["offset_mapping"]]
                for start, name in _occurrences(message["content"], shown):
                    copied = _split_by_part(name, start, offsets, len(ids))
                    if copied is not None:
                        found.append(replace(copied, lookup=name not in written))
                        written.add(name)
        ids += segment
    return ids, found


def score_copied_names(scored: Sequence[tuple[CopiedName, Sequence[bool]]]) -> dict:
    """{"names": n, part: {"tokens": n, "accuracy": share right or None}} for `NAME_PARTS`, where `hit[p]` says
    whether the model's greedy prediction for position p was the record's token there."""
    hits: dict[str, list[bool]] = {part: [] for part in NAME_PARTS}
    for name, hit in scored:
        hits["first"].append(bool(hit[name.first]))
        hits["middle"] += [bool(hit[p]) for p in name.middle]
        hits["last_word"] += [bool(hit[p]) for p in name.last_word]
        hits["whole"].append(all(hit[p] for p in name.positions))
    return {"names": len(scored), **{part: {"tokens": len(values),
                                            "accuracy": round(sum(values) / len(values), 4) if values else None}
                                     for part, values in hits.items()}}


def greedy_hits(model, ids: list[int], positions: Sequence[int]) -> list[bool]:
    """hit[p] for every p < len(ids): True where p is in `positions` and the model's greedy next token at p - 1 is
    ids[p]. Only the rows of `positions` go through the output layer (a large vocabulary's logits are big)."""
    import torch

    hit = [False] * len(ids)
    wanted = sorted({p for p in positions if p > 0})
    if not wanted:
        return hit
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    with torch.no_grad():
        keep = torch.tensor([p - 1 for p in wanted], device=device)
        predicted = model(input_ids=torch.tensor([ids], device=device), logits_to_keep=keep).logits[0].argmax(-1)
    model.train(was_training)
    for p, token in zip(wanted, predicted.tolist()):
        hit[p] = token == ids[p]
    return hit


def name_copy_accuracy(model, tokenizer, records: Sequence[dict], max_tokens: int | None = None) -> dict:
    """Teacher-forced accuracy of `model` on the names its `records` copy from their tool results, by part
    (`score_copied_names`), plus how many records held a copied name, and under `lookup` the same over each
    name's first occurrence in its record. Records over `max_tokens` are skipped."""
    scored: list[tuple[CopiedName, list[bool]]] = []
    with_names = 0
    for record in records:
        ids, names = copied_names(tokenizer, record["messages"])
        if not names or (max_tokens is not None and len(ids) > max_tokens):
            continue
        with_names += 1
        hit = greedy_hits(model, ids, [p for name in names for p in name.positions])
        scored += [(name, hit) for name in names]
    return {"records": with_names, **score_copied_names(scored),
            "lookup": score_copied_names([(name, hit) for name, hit in scored if name.lookup])}


def name_copy_metrics(report: dict, prefix: str = "name_copy") -> dict[str, float]:
    """A `name_copy_accuracy` report as flat MLflow metrics: `name_copy.<part>` and `name_copy.lookup.<part>`,
    leaving out parts with nothing to score."""
    metrics = {}
    for key, value in report.items():
        if isinstance(value, dict) and "accuracy" in value:
            if value["accuracy"] is not None:
                metrics[f"{prefix}.{key}"] = value["accuracy"]
        elif isinstance(value, dict):
            metrics.update(name_copy_metrics(value, f"{prefix}.{key}"))
    return metrics
