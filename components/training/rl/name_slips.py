"""Which sampled tokens coined a name: the token-level marks of `rl.rejected_turn_kinds: [name_slip]`.

`components.travel.names` finds, in text, each word the policy invented and the character where it left every
name it could have copied. This maps that character to the sampled token that wrote it, walking a trajectory
record's token segments in order, so that what the policy had been shown grows as the episode goes on (the prompt,
then each tool response). Each invented word is marked once, where the episode first wrote it.

The marked token is the policy's decision that went wrong: "len" in "Thal|len|ash" (the city was Thalwel), or the
`"` right after "Sellen" (it stopped a syllable short of Sellenash). With `rl.rejected_turn_advantage: c` those
tokens get A_t = c, like the tokens of a rejected turn.
"""
from __future__ import annotations

import bisect
from collections.abc import Iterable

from components.agent.tokens import TokenTexts
from components.travel.names import FORMAT_WORDS, KnownNames, invented_names


class NameSlipMarker:
    """Marks, per response token of a trajectory record, the tokens where an invented name left the known words."""

    def __init__(self, world_words: Iterable[str], tokenizer):
        self.known = KnownNames(set(world_words) | FORMAT_WORDS)
        self.tokenizer = tokenizer
        self.texts = TokenTexts(tokenizer)

    def marks(self, record: dict) -> list[int]:
        """1 on the response tokens where the episode first wrote each invented word (`response_ids` order)."""
        ids, mask = record["response_ids"], record["response_mask"]
        known = self.known.fork()
        known.learn(self.tokenizer.decode(record.get("prompt_ids") or [], skip_special_tokens=False))
        seen: set[str] = set()
        out = [0] * len(ids)
        start = 0
        while start < len(ids):
            end = start
            while end < len(ids) and mask[end] == mask[start]:
                end += 1
            text, offsets = self.texts.segment(ids[start:end])
            if not mask[start]:
                known.learn(text)
            else:
                for name in invented_names(text, known, seen):
                    out[start + bisect.bisect_right(offsets, min(name.slip, len(text) - 1)) - 1] = 1
            start = end
        return out
