"""Which sampled tokens repeated a place: the token-level marks of `rl.rejected_turn_kinds: [repeat]`.

The strict evaluator's restaurants and attractions checks fail when a plan names a place twice
(`evaluator.repeated_places`). This finds, in the answer turn of a trajectory record, the characters of every such
repeat after the first naming, and marks the sampled tokens that wrote them. With `rl.rejected_turn_advantage: c`
those tokens get A_t = c, like the tokens of a rejected turn: unlikelihood on the second "Stermer Table, Palavi"
and not on the first.

Sampled plans almost never repeat a place, while the greedy policy does, and more so after RL (docs/tiny_preset.md,
session 38); `rl.greedy_probes` rolls out the greedy policy beside the samples so that these marks have something
to find.
"""
from __future__ import annotations

import json
import re

from components.agent.tokens import TokenTexts
from components.travel.evaluator import repeated_places

SLOTS = ("breakfast", "lunch", "dinner", "attraction")
_VALUE = re.compile(r'"(breakfast|lunch|dinner|attraction)"\s*:\s*"((?:[^"\\]|\\.)*)"')


def answer_bounds(text: str) -> tuple[int, int] | None:
    """Where the plan lies in a turn's text: the characters between `<answer>` and `</answer>` (or the end)."""
    start = text.find("<answer>")
    if start < 0:
        return None
    start += len("<answer>")
    end = text.find("</answer>", start)
    return start, (len(text) if end < 0 else end)


def repeat_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) character spans, in `text` (one answer turn), of every restaurant or attraction the plan names
    again after naming it before. The plan's days are read from its JSON values in order (the i-th "lunch" value is
    day i's lunch); a plan whose days do not line up that way (a missing key, a key that is not a string) gives no
    spans rather than a wrong one."""
    bounds = answer_bounds(text)
    if bounds is None:
        return []
    start, end = bounds
    found: dict[str, list[tuple[int, int, str]]] = {slot: [] for slot in SLOTS}
    for match in _VALUE.finditer(text, start, end):
        try:
            value = json.loads(f'"{match.group(2)}"')
        except ValueError:
            return []
        found[match.group(1)].append((match.start(2), match.end(2), value))
    counts = {len(values) for values in found.values()}
    if len(counts) != 1 or not found["breakfast"]:
        return []
    days = [{slot: found[slot][i][2] for slot in SLOTS} for i in range(counts.pop())]
    spans = []
    for repeat in repeated_places(days):
        value_start, value_end, value = found[repeat.slot][repeat.position]
        raw = text[value_start:value_end]
        offset = raw.find(repeat.item) if repeat.slot == "attraction" else -1
        if offset >= 0 and value == raw:  # the item inside an unescaped "A, X;B, X;" list
            spans.append((value_start + offset, value_start + offset + len(repeat.item)))
        else:
            spans.append((value_start, value_end))
    return spans


class RepeatMarker:
    """Marks, per response token of a trajectory record, the tokens of the answer turn that repeat a place."""

    def __init__(self, tokenizer):
        self.texts = TokenTexts(tokenizer)

    def marks(self, record: dict) -> list[int]:
        """1 on the response tokens (`response_ids` order) that wrote a repeated place in an answer turn."""
        ids, mask = record["response_ids"], record["response_mask"]
        out = [0] * len(ids)
        kinds = [turn.get("kind") for turn in record.get("turns") or []]
        if "answer" not in kinds:
            return out
        starts = [i for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1])]
        if len(starts) != len(kinds):
            raise ValueError(f"record {record.get('idx')}: {len(starts)} sampled segments but {len(kinds)} turns; "
                             "was it written by this version of the agent loop?")
        for start, kind in zip(starts, kinds):
            if kind != "answer":
                continue
            end = start
            while end < len(ids) and mask[end]:
                end += 1
            text, offsets = self.texts.segment(ids[start:end])
            ends = offsets[1:] + [len(text)]
            for span_start, span_end in repeat_spans(text):
                for k, (begin, finish) in enumerate(zip(offsets, ends)):
                    if begin < span_end and finish > span_start:
                        out[start + k] = 1
        return out
