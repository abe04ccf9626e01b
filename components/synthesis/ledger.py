"""The running plan ("ledger") in an SFT record's thinks: every think restates the plan decided so far.

A plan is written at the end of its episode, but its names were read hundreds of tokens earlier, and a small model
trained from scratch does not copy from that far back (docs/tiny_preset.md, sessions 7-9: 32% per token from 300+
tokens back, against ~90% from under 100). With `filter.ledger`, the sft_data stage starts each assistant think
with the plan fields whose evidence the episode has already shown, in the plan's own order and words:

    <think>Plan so far:
    Day 1: current_city from Sava to Zorpel | transportation Self-driving, from Sava to Zorpel, duration: ... | ...
    Day 2: current_city Zorpel | accommodation Heltorno Cottage, Zorpel
    Day 3: current_city from Zorpel to Sava
    I check ...</think>

so every field is copied once from the observation just read, then carried forward think by think (a copy of the
previous think's ledger, a few hundred tokens back, in order), and the answer copies the last ledger, which sits in
its own turn. The annotation is made with hindsight (the record's final plan), so a field appears from the first
think after the observation that shows it: a transport string after the route or flight search that returned it,
a listing's "Name, City" after the search that listed it, a city as soon as the conversation has named it. Fields
that are "-" are left out. The conversation's tool calls and observations are unchanged, so a record still
replays exactly (and renames, components/synthesis/rename.py) as before.

With `filter.ledger_route`, the block opens with the trip's route in the form of the copy task's route rounds
(components/synthesis/copy_task.py), which the tiny base learned in pre-training:

    <think>Route: Sava -> Zorpel
    Plan so far:
    ...

Picking the origin out of the query by its cue word ("departing from", "starting in") is the one copy in an episode
that is not a copy of the text just before it; the base does it in the route form (copy probe `route` 99.9%,
session 13), while the ledger's `current_city from ... to ...` needed SFT to learn it anew and missed the origin's
first syllable in 40 of 40 held-out episodes (docs/tiny_preset.md, session 13). The route names the first day's
cities and joins the ledger when they are evidenced, like any field.

With `filter.ledger_itinerary` as well, the route line is the whole trip, the way home included:

    <think>Route: Sava -> Zorpel -> Sava

so the last day's `current_city from Zorpel to Sava` follows `Zorpel -> Sava` a few lines up; and with
`filter.ledger_later_legs_shown` a travel day after the first joins the ledger only with the search that shows its
leg (`self-driving, from Zorpel to Sava, ...`), not in the first think. Both aim at the one copy a base pre-trained
longer on QA missed (the origin after `from Zorpel to`, 0 of 40 held-out first thinks teacher-forced, where ` to`
was always followed by the destination before). Measured once on two bases, neither raised delivery; both are off
(docs/tiny_preset.md, session 19).
"""
from __future__ import annotations

import re

LEDGER_LEAD = "Plan so far:"
ROUTE_LEAD = "Route:"
FIELD_SEPARATOR = " | "
PLAN_KEYS = ("current_city", "transportation", "breakfast", "attraction", "lunch", "dinner", "accommodation")
LEDGER_BLOCK = re.compile(r"(?:" + re.escape(ROUTE_LEAD) + r" [^\n]*\n)?" + re.escape(LEDGER_LEAD)
                          + r"\n(?:Day \d+:[^\n]*\n)+")
_THINK_OPEN = "<think>"
_ROUTE = re.compile(r"^from (.+) to (.+)$")
_FLIGHT = re.compile(r"Flight Number: (\S+?),")


def named_entities(value: str) -> list[str]:
    """The listing names of a "Name, City" field, or of an attraction field "Name, City;Name, City;"."""
    names = []
    for part in value.split(";"):
        part = part.strip()
        if part:
            names.append(part.rsplit(", ", 1)[0] if ", " in part else part)
    return names


def _has_word(text: str, word: str) -> bool:
    return re.search(r"(?<!\w)" + re.escape(word) + r"(?!\w)", text) is not None


def _lists_row(text: str, name: str) -> bool:
    """Whether an observation lists a row whose first cell is `name`."""
    return any(line.split("\t", 1)[0] == name for line in text.split("\n") if "\t" in line)


def evidenced(key: str, value: str, seen: list[str]) -> bool:
    """Whether the texts `seen` so far (the query and the observations) show what field `key` = `value` needs."""
    if key == "current_city":
        route = _ROUTE.match(value)
        cities = list(route.groups()) if route else [value]
        return all(any(_has_word(text, city) for text in seen) for city in cities)
    if key == "transportation":
        flight = _FLIGHT.search(value)
        if flight:
            return any(_has_word(text, flight.group(1)) for text in seen)
        tail = value.lower()
        return any(tail in text.lower() for text in seen)
    return all(any(_lists_row(text, name) for text in seen) for name in named_entities(value))


def route_cities(plan: list[dict], itinerary: bool = False) -> list[str]:
    """The cities of the route line: the first day's "from A to B" (A, B), or with `itinerary` every city the trip
    passes in order, the way home included (A, B, C, A); [] when the first day does not travel."""
    cities: list[str] = []
    for number, day in enumerate(plan if itinerary else plan[:1]):
        route = _ROUTE.match(" ".join(str(day.get("current_city", "")).split()))
        if route is None:
            if number == 0:
                return []
            continue
        origin, destination = route.groups()
        cities += ([origin] if not cities or cities[-1] != origin else []) + [destination]
    return cities


def leg_shown(value: str, seen: list[str]) -> bool:
    """Whether a text in `seen` shows the leg `from A to B` itself (a route or flight search's observation)."""
    return any(_has_word(text, value) for text in seen)


def ledger_text(plan: list[dict], seen: list[str], complete: bool = False, route: bool = False,
                itinerary: bool = False, later_legs_shown: bool = False) -> str:
    """The ledger block for a think preceded by the texts `seen` ("" when no field is evidenced yet); `complete`
    restates every field (the answer's turn); `route` opens the block with the route (`route_cities`; the whole trip
    with `itinerary`) as far as its cities are evidenced, once the first two are; with `later_legs_shown` a travel day
    after the first (`from A to B`) joins only once a text shows that leg, not as soon as both cities are named."""
    lines = []
    for number, day in enumerate(plan, start=1):
        fields = []
        for key in PLAN_KEYS:
            value = " ".join(str(day.get(key, "-") or "-").split())  # one line per day, whatever the value
            if value in ("", "-"):
                continue
            if not complete and later_legs_shown and key == "current_city" and number > 1 and _ROUTE.match(value):
                if not leg_shown(value, seen):
                    break  # the day joins with its leg: nothing of it before the search that shows the way
            if complete or evidenced(key, value, seen):
                fields.append(f"{key} {value}")
        if fields:
            label = day.get("days", day.get("day"))
            lines.append(f"Day {label if isinstance(label, int) and label >= 0 else number}: "
                         + FIELD_SEPARATOR.join(fields))
    if not lines:
        return ""
    head = None
    if route:
        cities = route_cities(plan, itinerary)
        known = next((n for n, city in enumerate(cities) if not evidenced("current_city", city, seen)), len(cities))
        cities = cities if complete else cities[:known]  # the route as far as the conversation has named it
        head = f"{ROUTE_LEAD} " + " -> ".join(cities) if len(cities) >= 2 else None
    return (f"{head}\n" if head else "") + f"{LEDGER_LEAD}\n" + "\n".join(lines) + "\n"


def with_ledger(messages: list[dict], plan: list[dict] | None, route: bool = False,
                itinerary: bool = False, later_legs_shown: bool = False) -> list[dict]:
    """The messages with every assistant think prefixed by the ledger of `plan` (the episode's final plan) as far
    as the conversation before it shows; the answer's think gets the complete plan; `route` opens each ledger with
    the route line (the whole trip with `itinerary`); `later_legs_shown` holds a later travel day back until a
    search shows its leg (`ledger_text`). Without a plan the messages are returned as they are."""
    if not plan:
        return list(messages)
    last_assistant = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
    out, seen = [], []
    for index, message in enumerate(messages):
        content = message["content"]
        if message["role"] == "assistant" and content.startswith(_THINK_OPEN):
            block = ledger_text(plan, seen, complete=index == last_assistant, route=route, itinerary=itinerary,
                                later_legs_shown=later_legs_shown)
            message = {**message, "content": _THINK_OPEN + block + content[len(_THINK_OPEN):]}
        elif message["role"] != "system":
            seen.append(content)
        out.append(message)
    return out


def without_ledger(text: str) -> str:
    """`text` with every ledger block taken out (the tokenizer's corpus: the text as it was before ledgers)."""
    return LEDGER_BLOCK.sub("", text)
