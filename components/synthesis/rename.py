"""Fresh names per SFT record: every record becomes a trajectory of its own isomorphic world.

A small model trained on one world memorises its few hundred names and never learns to read them from the
context (docs/tiny_preset.md: every call went to one memorised training city). Renaming each record's entities
with freshly coined words, consistently within the record (query, tool calls, observations, thoughts, plan), keeps
the trajectory correct for a world that differs only in names, and leaves copying from the context as the only way
to predict a name. Flight numbers are re-drawn the same way. Used by the sft_data stage (`filter.rename_entities`)
for synthetic worlds; names of an imported (real) world are left alone.
"""
from __future__ import annotations

import random
import re
from collections.abc import Callable

from components.synthesis.expert import SLIP_PATTERN, slip_name
from components.travel.tools import CITY_HINT, UNKNOWN_CITY_LINE, city_hint, closest_cities, without_city_hints
from components.travel.synthetic import NAME_SYLLABLES

_FLIGHT_NUMBER = re.compile(r"\bF(\d{3,8})\b")


def world_name_words(world) -> set[str]:
    """The coined words of a synthetic world: states, cities, and the first word of every listing's name."""
    words = set(world.states) | set(world.cities)
    for city in world.cities:
        for rows, key in ((world.accommodations_in(city), "NAME"), (world.restaurants_in(city), "Name"),
                          (world.attractions_in(city), "Name")):
            words.update(str(row[key]).split()[0] for row in rows if row.get(key))
    return {word for word in words if word.isalpha()}


class Renamer:
    """Renames the words of `names` (case kept: Word, word, WORD) and flight numbers in a record's texts."""

    def __init__(self, names: set[str], seed: int = 0, cities: list[str] | tuple[str, ...] = (), hint_cities: int = 0):
        """`names`: the words to rename (`world_name_words`); `cities` and `hint_cities`: the world's cities and how
        many an unknown-city error suggests (`World.city_hints`), to derive hints among the renamed cities."""
        if not names:
            raise ValueError("no names to rename: is the world empty?")
        ordered = sorted(names, key=lambda w: (-len(w), w))
        self._pattern = re.compile(r"\b(" + "|".join(map(re.escape, ordered)) + r")\b", re.IGNORECASE)
        self._taken = {name.lower() for name in names}
        self._seed = seed
        self._cities = tuple(cities)
        self._hint_cities = hint_cities

    def record(self, record: dict, index: int) -> dict:
        """A copy of the SFT `record` with every name and flight number replaced, consistently within it (the
        system prompt, which names nothing of the world, is kept as it is). The renamed text no longer matches any
        token ids, so those are dropped (SFT renders the messages)."""
        return self.rename(record, index)[0]

    def rename(self, record: dict, index: int) -> tuple[dict, Callable[[str], str]]:
        """(the renamed record, the record's substitution): the function renames any further text the same way
        (a name the record did not mention gets a fresh word of its own), e.g. the world's tables in tests."""
        substitute = self.substitution(random.Random(f"{self._seed}:{index}"))
        substitute = self.keeping_slips(record["messages"], substitute)
        # Hints are derived from the world's city names, not renamed: taken out here, derived again among the
        # renamed cities below (the names closest to a renamed slip are not the renamed closest names).
        hinted = [m["role"] != "system" and bool(CITY_HINT.search(m["content"])) for m in record["messages"]]
        messages = [m if m["role"] == "system" else {**m, "content": substitute(without_city_hints(m["content"]))}
                    for m in record["messages"]]
        if any(hinted):
            messages = self.rehinted(messages, hinted, substitute)
        out = {k: v for k, v in record.items() if k not in ("prompt_ids", "response_ids", "response_mask")}
        out["messages"] = messages
        return out, substitute

    def rehinted(self, messages: list[dict], hinted: list[bool], substitute: Callable[[str], str]) -> list[dict]:
        """The messages with the unknown-city errors of those `hinted` ending with the hint the renamed world gives
        (`tools.closest_cities` among the renamed cities), so the record replays exactly in the renamed world."""
        if not self._cities or not self._hint_cities:
            raise ValueError("a record with unknown-city hints needs Renamer(..., cities=world.cities, "
                             "hint_cities=world.city_hints)")
        renamed_cities = [substitute(city) for city in self._cities]

        def hint(match: re.Match) -> str:
            return match.group(0) + city_hint(closest_cities(renamed_cities, match.group("city"), self._hint_cities))

        return [{**m, "content": UNKNOWN_CITY_LINE.sub(hint, m["content"])} if flag else m
                for m, flag in zip(messages, hinted)]

    @staticmethod
    def keeping_slips(messages: list[dict], substitute: Callable[[str], str]) -> Callable[[str], str]:
        """`substitute`, extended to the record's slipped names (the expert's `slip_rate`): a slip of a city stays
        the same slip of the city's new name ("Helca" for Helcano becomes "Brato" for Bratorno), so a renamed
        recovery still shows a near miss and its correction."""
        slips = {wrong: right for m in messages for wrong, right in SLIP_PATTERN.findall(m["content"])}
        if not slips:
            return substitute
        marks = {wrong: f"\x00{i}\x00" for i, wrong in enumerate(sorted(slips, key=len, reverse=True))}
        pattern = re.compile(r"\b(" + "|".join(map(re.escape, marks)) + r")\b")
        renamed = {marks[wrong]: slip_name(substitute(right)) for wrong, right in slips.items()}

        def with_slips(text: str) -> str:
            text = substitute(pattern.sub(lambda match: marks[match.group(0)], text))
            for mark, new in renamed.items():
                text = text.replace(mark, new)
            return text

        return with_slips

    def substitution(self, rng: random.Random) -> Callable[[str], str]:
        """A text -> text function renaming names and flight numbers with words and digits drawn from `rng`, the
        same name always to the same word."""
        words: dict[str, str] = {}
        numbers: dict[str, str] = {}

        def fresh_word(match: re.Match) -> str:
            text = match.group(0)
            key = text.lower()
            if key not in words:
                words[key] = self._coin(rng, set(words.values()))
            return _same_case(words[key], text)

        def fresh_number(match: re.Match) -> str:
            digits = match.group(1)
            if digits not in numbers:
                used = set(numbers.values())
                candidate = digits
                while candidate in used or candidate == digits:
                    candidate = "".join(rng.choice("0123456789") for _ in digits)
                numbers[digits] = candidate
            return "F" + numbers[digits]

        return lambda text: _FLIGHT_NUMBER.sub(fresh_number, self._pattern.sub(fresh_word, text))

    def _coin(self, rng: random.Random, used: set[str]) -> str:
        """A fresh 2-3 syllable word that is not a name of the world nor already used in this record."""
        while True:
            word = "".join(rng.choice(NAME_SYLLABLES) for _ in range(rng.randint(2, 3)))
            if word not in self._taken and word not in used:
                return word


def _same_case(word: str, like: str) -> str:
    if like.isupper() and len(like) > 1:
        return word.upper()
    if like[:1].isupper():
        return word.capitalize()
    return word.lower()
