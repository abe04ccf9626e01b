"""Invented names: words an agent wrote as names that it had not been shown.

A TravelPlanner plan is graded name by name: every city, restaurant, attraction and accommodation must be one of the
database's, copied exactly (the strict evaluator's within-sandbox check). A small policy miswrites them: it stops a
name a syllable early ("Sellen" for Sellenash), runs on ("Thalwelash" for Thalwel) or coins one from syllables it has
seen ("Briashhel Studio" where the listing said "Baash Retreat"). This module finds those words in a text, and the
character where each one leaves every name the agent could have copied, so that the RL stage can put its credit on
that token (`rl.rejected_turn_kinds: [name_slip]`).

A word here is a capitalised run of letters (`NAME_WORD`): "Sellenash", "Baash", "Retreat". It is *known* when it
is a word of a name in the world (cities, states, every text field of the listings) or a word of what the agent was
shown before it wrote it (the system prompt, the query, earlier tool responses; `known` grows as an episode goes
on, so a name echoed back by an "Unknown city" error does not excuse the turn that coined it), or one of
`FORMAT_WORDS`, the capitalised English of the turn format and of the programmatic expert's thinks. Every other word
is invented. Its slip is the first character past its longest prefix that begins some known word: "Sellen" is a
prefix of Sellenash, so its slip is the character after it (the name ended too soon); "Thalwelash" leaves the known
words after "Thalwel"; "Briashhel" after "Bri".

Scope: `FORMAT_WORDS` lists the English of this project's compact turn format and expert thinks (a test checks that
the expert's own episodes contain no invented word). Free-form thinks (an LLM teacher's) hold English words that
are neither names nor in that list, and those would count as invented.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

NAME_WORD = re.compile(r"[A-Z][a-z]+")

# Capitalised words of the turn format and the expert's thinks that are not names (and not always in the prompt).
FORMAT_WORDS = frozenset(
    "Arrival Day Departure Even First Flight My Next No Now Number Plan Route Self Taxi The Then Time Total Trip".split())


@dataclass(frozen=True)
class InventedName:
    """An invented word at `text[start:start + len(word)]`; `slip` is the offset where it leaves the known words."""

    word: str
    start: int
    slip: int


def name_words(texts: Iterable[str]) -> set[str]:
    """The capitalised words (`NAME_WORD`) of `texts`."""
    words: set[str] = set()
    for text in texts:
        words.update(NAME_WORD.findall(text))
    return words


def world_name_words(world) -> frozenset[str]:
    """Every word of the world's names: cities, states, and each text field of every listing of every city."""
    texts: list[str] = []
    for city in world.cities:
        texts.append(city)
        texts.append(world.state_of(city) or "")
        for rows in (world.accommodations_in(city), world.restaurants_in(city), world.attractions_in(city)):
            texts.extend(value for row in rows for value in row.values() if isinstance(value, str))
    return frozenset(name_words(texts))


class KnownNames:
    """The words an agent may write at one point of an episode, and their prefixes (for the slip offset).

    Start it with the world's words (`world_name_words`) and `FORMAT_WORDS`; `learn` what the episode shows
    (prompt, tool responses) as it goes. Each episode needs its own (`fork` copies the world's part cheaply)."""

    def __init__(self, words: Iterable[str]):
        self.words = set(words)
        self.prefixes = {word[:k] for word in self.words for k in range(1, len(word) + 1)}

    def fork(self) -> "KnownNames":
        copy = KnownNames(())
        copy.words, copy.prefixes = set(self.words), set(self.prefixes)
        return copy

    def learn(self, text: str) -> None:
        for word in NAME_WORD.findall(text):
            if word not in self.words:
                self.words.add(word)
                self.prefixes.update(word[:k] for k in range(1, len(word) + 1))

    def slip_offset(self, word: str) -> int:
        """Length of the longest prefix of `word` that begins a known word (`len(word)`: it stopped short)."""
        k = len(word)
        while k > 0 and word[:k] not in self.prefixes:
            k -= 1
        return k


def invented_names(text: str, known: KnownNames, seen: set[str] | None = None) -> list[InventedName]:
    """The invented words of `text`, in order. With `seen`, only words not in it (and they are added to it): the
    first time an episode wrote each invented word, so that copying one's own earlier slip is not counted again."""
    found = []
    for match in NAME_WORD.finditer(text):
        word = match.group()
        if word in known.words or (seen is not None and word in seen):
            continue
        if seen is not None:
            seen.add(word)
        found.append(InventedName(word, match.start(), match.start() + known.slip_offset(word)))
    return found


def episode_invented_names(messages: list[dict], world_words: Iterable[str]) -> list[InventedName]:
    """The invented words of an episode's assistant messages (first occurrences), each judged against the world's
    words, `FORMAT_WORDS` and every non-assistant message before it."""
    known = KnownNames(set(world_words) | FORMAT_WORDS)
    seen: set[str] = set()
    found: list[InventedName] = []
    for message in messages:
        content = message.get("content") or ""
        if message.get("role") == "assistant":
            found.extend(invented_names(content, known, seen))
        else:
            known.learn(content)
    return found
