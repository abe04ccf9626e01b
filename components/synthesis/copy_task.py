"""A copy task for the tiny base's pre-training: the in-context copying that reading tool observations needs.

A model of a few million parameters trained from scratch on travel or QA trajectories learns the protocol but not
to copy a name it has never seen out of its context (docs/tiny_preset.md): it writes memorised or made-up names.
On a task where every target token is a copy, the copying circuit (an induction head) forms within minutes on two
CPU cores (measured: copy accuracy 0.33 -> 0.72 in 5 minutes, batch 32 of ~80 tokens). Each record is a chat of a
few rounds, each either

- repeat: `Repeat: Kabranta, F0412, Helcano` -> `Kabranta, F0412, Helcano`, or
- look up: `Pairs: Kabranta -> Lune Gardens; Merwa -> F0412; ... Look up: Merwa` -> `Merwa -> F0412`, or
- route (a share `route_fraction` of all rounds): a travel request in the query synthesiser's phrasings, over
  coined cities, -> `Route: Gortu -> Palavi`: the origin and destination picked out by their cue words ("starting in",
  "heading to"), the look-up an agent's first tool call makes, or
- fact (a share `fact_fraction` of all rounds): three encyclopedia passages about fresh entities, shown as the
  search tool shows them, and a question about one -> `Answer: Mirathal`: the look-up a QA episode makes (find the
  sentence about the question's entity, copy its value),

over freshly coined names (the travel world's syllables), flight-style ids and prices, so nothing can be memorised.
The look-up round is the travel task's move: find the key in the context, copy what follows it. A share
`recap_fraction` of the records are longer and end with a recap: `Recap: repeat every answer you gave above` -> every
answer again, joined by ` | `, copies of text hundreds of tokens back (a plan copies names read early in its episode).
"""
from __future__ import annotations

import random
from typing import Literal

from pydantic import Field

from components.params import Params
from components.travel.synthetic import _ATTRACTION_KINDS, _LISTING_KINDS, _RESTAURANT_KINDS, NAME_SYLLABLES

SYSTEM = "You copy names, ids and numbers exactly as they are written."
RECAP = "Recap: repeat every answer you gave above, in order."
RECAP_SEPARATOR = " | "


class CopyTaskParams(Params):
    """`model.pretrain_copy`: how many copy-task records join the tiny base's QA pre-training (0: none)."""

    records: int = Field(0, ge=0)
    rounds: tuple[int, int] = (3, 6)
    items: tuple[int, int] = (2, 6)
    repeat_fraction: float = Field(0.4, ge=0, le=1)  # the rest are look-ups
    route_fraction: float = Field(0.0, ge=0, le=1)  # the share of rounds that are travel-request routes
    fact_fraction: float = Field(0.0, ge=0, le=1)  # the share of rounds that are encyclopedia look-ups (QA's move)
    fact_passages: int = Field(3, ge=1, le=8)  # passages a fact round shows (1: the value follows its entity)
    # The share of values drawn in the tool observations' own forms ("6 hours 23 mins", "521 km", "955", "13:51",
    # "Kawadro Inn"): the tokens a ledger copies out of an observation, which the other values never contain.
    observation_values: float = Field(0.0, ge=0, le=1)
    recap_fraction: float = Field(0.0, ge=0, le=1)  # the share of records that end with a recap of every answer
    recap_rounds: tuple[int, int] = (10, 20)  # rounds before a recap (longer records: the copies are far back)
    warmup_minutes: float | None = Field(None, gt=0)  # copy-only training before the QA mix (None and no
    # warmup_max_steps: mixed from the start); the other training keys (lr, batch) are model.pretrain's
    warmup_lr_scheduler: Literal["cosine", "linear", "constant"] = "constant"  # the copy circuit forms at full rate
    # End the warm-up early at this held-out copy loss: when copying forms varies from run to run (a phase change
    # measured at 4.5 to over 9 minutes), so warmup_minutes is a cap and this is the goal.
    warmup_target_loss: float | None = Field(None, gt=0)
    # The warm-up's step budget (None: pretrain.max_steps). With it, and the target checked every eval_every steps,
    # where the warm-up stops does not depend on the machine's speed; warmup_minutes is then only a safety cap.
    warmup_max_steps: int | None = Field(None, ge=1)
    # Restarts when copying does not form: at warmup_check's step, an attempt whose held-out copy loss is above the
    # check's loss is abandoned and the warm-up starts again from a freshly initialised model (model seed + 1), at
    # most warmup_attempts times in all; the last attempt always runs to its end. Whether the copying circuit forms
    # in time is a coin flip of the initialisation (docs/tiny_preset.md, session 6); this makes it a few flips.
    warmup_check: tuple[int, float] | None = None
    warmup_attempts: int = Field(1, ge=1)
    seed: int = 0


def observation_value(rng: random.Random) -> str:
    """A fresh value in a tool observation's form: a drive's duration ("6 hours 23 mins") or distance ("521 km"),
    a bare number (a cost, a price, "955"), a clock time ("13:51") or a listing's name with its kind ("Kawadro Inn").

    A copying circuit only copies the tokens it was trained to copy: a base warmed up on names, ids and "$318" prices
    predicted " 22" for every duration (its SFT checkpoint copied the hour of a drive 0% of the time, from an
    observation or from its own ledger one turn back; docs/tiny_preset.md, session 15)."""
    kind = rng.random()
    if kind < 0.25:
        hours = rng.randint(0, 30)
        minutes = f"{rng.randint(1, 59)} mins"
        return f"{hours} hours {minutes}" if hours else minutes
    if kind < 0.4:
        return f"{rng.randint(5, 3000):,} km"
    if kind < 0.7:
        return str(rng.randint(1, 2000))
    if kind < 0.8:
        return f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"
    return f"{coined_name(rng)} {rng.choice(_LISTING_KINDS)}"


def coined_value(rng: random.Random, observation_share: float = 0.0) -> str:
    """A fresh name ("Kabranta", "Helcano Gardens"), a flight-style id ("F0412") or a price ("$318"); with
    probability `observation_share` a value in an observation's form instead (`observation_value`). A share of 0
    draws nothing more from `rng`, so records without it are unchanged."""
    if observation_share and rng.random() < observation_share:
        return observation_value(rng)
    kind = rng.random()
    if kind < 0.6:
        name = coined_name(rng)
        if rng.random() < 0.4:
            name += " " + rng.choice(_RESTAURANT_KINDS + _ATTRACTION_KINDS)
        return name
    if kind < 0.8:
        return "F" + "".join(rng.choice("0123456789") for _ in range(4))
    return f"${rng.randint(10, 2000)}"


def _distinct(rng: random.Random, count: int, observation_share: float = 0.0) -> list[str]:
    values: list[str] = []
    while len(values) < count:
        value = coined_value(rng, observation_share)
        if value not in values:
            values.append(value)
    return values


def coined_name(rng: random.Random) -> str:
    """A fresh one-word name of 2-3 of the world's syllables ("Gortu", "Palavi")."""
    return "".join(rng.choice(NAME_SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()


def route_round(rng: random.Random) -> tuple[str, str]:
    """(user text, assistant text): a travel request over two coined cities, answered `Route: origin -> destination`.

    The request is rendered by the query synthesiser (`render_query_text`: every opening phrasing, people, budget,
    constraints), so the cue before each city is one the travel queries use."""
    from components.synthesis.text import render_query_text

    org = coined_name(rng)
    dest = coined_name(rng)
    while dest == org:
        dest = coined_name(rng)
    days = rng.choice((3, 5, 7))
    first = rng.randint(1, 20)
    fields = {"org": org, "dest": dest, "days": days, "visiting_city_number": 1 if days == 3 else rng.choice((2, 3)),
              "date": [f"2022-03-{first + d:02d}" for d in range(days)], "people_number": rng.randint(1, 8),
              "budget": rng.randint(8, 120) * 100, "local_constraint": {}}
    return render_query_text(fields, rng), f"Route: {org} -> {dest}"


FACT_LEAD = "Answer:"


def fact_round(rng: random.Random, shown: int = 3) -> tuple[str, str]:
    """(user text, assistant text): `shown` passages of a fresh little encyclopedia (the search tool's `Doc i(Title:
    ...)` lines, in a random order) and a single-hop question whose answer is in one of them -> `Answer: <value>`.

    The entities' names are coined afresh for every round, so the value can only be copied, never remembered."""
    from components.evaluation.qa.corpus import build_passages, generate_entities, single_hop_questions
    from components.evaluation.qa.retriever import format_passages

    entities = generate_entities(num_people=3, num_towns=3, num_organisations=2, seed=rng.randrange(2**31))
    passages = build_passages(entities)
    question = rng.choice(single_hop_questions(entities, passages))
    gold = int(question["gold_passages"][0])
    others = rng.sample([i for i in range(len(passages)) if i != gold], shown - 1)
    order = rng.sample([gold, *others], shown)
    text = format_passages([passages[i].to_dict() for i in order])
    return f"{text}\nQuestion: {question['question']}", f"{FACT_LEAD} {question['golden_answers'][0]}"


def copy_round(rng: random.Random, items: tuple[int, int], repeat_fraction: float = 0.4,
               route_fraction: float = 0.0, fact_fraction: float = 0.0, fact_passages: int = 3,
               observation_values: float = 0.0) -> tuple[str, str]:
    """(user text, assistant text) of one round: a route (with probability `route_fraction`), a fact look-up (with
    probability `fact_fraction`), else a repeat (with probability `repeat_fraction`) or a look-up over fresh values.
    A kind whose share is 0 draws nothing from `rng`, so records without it are unchanged."""
    if route_fraction and rng.random() < route_fraction:
        return route_round(rng)
    if fact_fraction and rng.random() < fact_fraction:
        return fact_round(rng, fact_passages)
    n = rng.randint(*items)
    if rng.random() < repeat_fraction:
        values = _distinct(rng, n, observation_values)
        return "Repeat: " + ", ".join(values), ", ".join(values)
    keys, values = _distinct(rng, n), [coined_value(rng, observation_values) for _ in range(n)]
    asked = rng.sample(range(n), rng.randint(1, min(2, n)))
    pairs = "; ".join(f"{k} -> {v}" for k, v in zip(keys, values))
    question = "Look up: " + ", ".join(keys[i] for i in asked)
    return f"Pairs: {pairs}.\n{question}", "; ".join(f"{keys[i]} -> {values[i]}" for i in asked)


def copy_records(params: CopyTaskParams) -> list[dict]:
    """`params.records` chat records (`messages` with `train` on the assistant turns), seeded by `params.seed`.

    With probability `recap_fraction` a record has `recap_rounds` rounds and ends with a recap: every answer above,
    in order (RECAP). Its tokens are copies of text hundreds of tokens back, the distance at which a plan copies the
    names its agent read early in the episode."""
    rng = random.Random(params.seed)
    records = []
    for index in range(params.records):
        messages = [{"role": "system", "content": SYSTEM, "train": False}]
        recap = bool(params.recap_fraction) and rng.random() < params.recap_fraction
        answers = []
        for _ in range(rng.randint(*(params.recap_rounds if recap else params.rounds))):
            user, assistant = copy_round(rng, params.items, params.repeat_fraction, params.route_fraction,
                                         params.fact_fraction, params.fact_passages, params.observation_values)
            messages += [{"role": "user", "content": user, "train": False},
                         {"role": "assistant", "content": assistant, "train": True}]
            answers.append(assistant)
        if recap:
            messages += [{"role": "user", "content": RECAP, "train": False},
                         {"role": "assistant", "content": RECAP_SEPARATOR.join(answers), "train": True}]
        records.append({"id": f"copy-{index}", "source": "copy_task", "messages": messages})
    return records
