"""Query text (query synthesis, step 4): a template renderer with varied phrasings, and an LLM
back-translation mode through an OpenAI-compatible endpoint (few-shot, as Agent-STAR).
"""
from __future__ import annotations

import json
import random
from datetime import date
from typing import Any

OPENINGS = (
    "Please help me plan a trip from {org} to {dest} spanning {days} days from {start} to {end}.",
    "Could you create a {days}-day travel plan from {org} to {dest}, from {start} to {end}?",
    "I'm planning a {days}-day journey departing from {org} and heading to {dest}, {start} through {end}.",
    "Design a travel itinerary from {org} to {dest} for {days} days, from {start} to {end}.",
    "We want to travel from {org} to {dest} for {days} days, leaving on {start} and returning on {end}.",
    "Can you put together a {days}-day trip starting in {org} and visiting {dest} between {start} and {end}?",
)
CITY_COUNT = (
    " The trip should cover {n} cities in {dest}.",
    " I'd like to see {n} different cities there.",
    " Please include {n} cities of {dest} in the route.",
)
PEOPLE = (
    " The plan is for {people}.",
    " We are a group of {people_n}.",
    " It is for {people}.",
)
BUDGET = (
    " The budget is ${budget:,}.",
    " We can spend up to ${budget:,}.",
    " Our total budget is ${budget:,}.",
    " Keep everything within ${budget:,}.",
)
HOUSE_RULE = {
    "parties": (" We plan to host a small party, so the place must allow parties.",
                " Our accommodation has to permit parties."),
    "smoking": (" Some of us smoke, so the accommodation must allow smoking.",
                " We need a place where smoking is allowed."),
    "children under 10": (" We travel with children under 10, so the place must welcome them.",
                          " The accommodation must allow children under 10."),
    "pets": (" We are bringing our pet, so the place must allow pets.",
             " Pets must be allowed where we stay."),
    "visitors": (" We expect visitors, so the accommodation must allow them.",
                 " Visitors must be allowed at our accommodation."),
}
ROOM_TYPE = {
    "entire room": (" We'd like an entire home or apartment.", " We prefer to book an entire room."),
    "private room": (" A private room is what we want.", " Please find private rooms."),
    "shared room": (" A shared room is fine for us.", " We are looking for a shared room."),
    "not shared room": (" We don't want a shared room.", " Please avoid shared rooms."),
}
CUISINE = (" We'd love to try {cuisines} cuisine during the trip.", " Please include {cuisines} food in our meals.")
TRANSPORTATION = {
    "no flight": (" We don't want to fly.", " Please avoid flights."),
    "no self-driving": (" We won't be driving ourselves.", " Self-driving is not an option for us."),
}
NUMBER_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def spoken_date(iso: str) -> str:
    """'2022-03-16' -> 'March 16th, 2022'."""
    d = date.fromisoformat(iso)
    return f"{d.strftime('%B')} {ordinal(d.day)}, {d.year}"


def join_words(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def render_query_text(fields: dict, rng: random.Random) -> str:
    """A natural-language query stating every structured field, with seeded phrasing."""
    people = fields["people_number"]
    values = {
        "org": fields["org"], "dest": fields["dest"], "days": fields["days"],
        "start": spoken_date(fields["date"][0]), "end": spoken_date(fields["date"][-1]),
        "n": fields["visiting_city_number"], "budget": fields["budget"],
        "people": "one person" if people == 1 else f"{NUMBER_WORDS.get(people, people)} people",
        "people_n": NUMBER_WORDS.get(people, str(people)),
    }
    parts = [rng.choice(OPENINGS)]
    if fields["visiting_city_number"] > 1:
        parts.append(rng.choice(CITY_COUNT))
    parts.append(rng.choice(PEOPLE[:1] if people == 1 else PEOPLE))
    parts.append(rng.choice(BUDGET))
    constraint = fields.get("local_constraint") or {}
    if constraint.get("house rule"):
        parts.append(rng.choice(HOUSE_RULE[constraint["house rule"]]))
    if constraint.get("room type"):
        parts.append(rng.choice(ROOM_TYPE[constraint["room type"]]))
    if constraint.get("cuisine"):
        parts.append(rng.choice(CUISINE).replace("{cuisines}", join_words(list(constraint["cuisine"]))))
    if constraint.get("transportation"):
        parts.append(rng.choice(TRANSPORTATION[constraint["transportation"]]))
    return "".join(parts).format(**values).strip()


FEW_SHOT = (
    ({"org": "St. Petersburg", "dest": "Rockford", "days": 3, "visiting_city_number": 1,
      "date": ["2022-03-16", "2022-03-17", "2022-03-18"], "people_number": 1,
      "local_constraint": {"house rule": None, "cuisine": None, "room type": None, "transportation": None},
      "budget": 1700},
     "Please help me plan a trip from St. Petersburg to Rockford spanning 3 days from March 16th to March 18th, "
     "2022. The travel should be planned for a single person with a budget of $1,700."),
    ({"org": "Seattle", "dest": "Texas", "days": 5, "visiting_city_number": 2,
      "date": ["2022-03-10", "2022-03-11", "2022-03-12", "2022-03-13", "2022-03-14"], "people_number": 2,
      "local_constraint": {"house rule": "pets", "cuisine": None, "room type": None, "transportation": None},
      "budget": 5200},
     "We are two people planning a 5-day trip from Seattle to Texas, visiting 2 cities from March 10th to March "
     "14th, 2022. Our budget is $5,200 and we're bringing our dog, so the accommodations must allow pets."),
    ({"org": "Denver", "dest": "California", "days": 7, "visiting_city_number": 3,
      "date": ["2022-03-20", "2022-03-21", "2022-03-22", "2022-03-23", "2022-03-24", "2022-03-25", "2022-03-26"],
      "people_number": 4,
      "local_constraint": {"house rule": None, "cuisine": ["Mexican", "Italian"], "room type": "entire room",
                           "transportation": "no flight"},
      "budget": 9800},
     "Could you design a 7-day road trip for four of us from Denver through 3 cities in California, March 20th to "
     "26th, 2022? We don't want to fly, we'd like entire homes to stay in, and we hope to eat Mexican and Italian "
     "food. The budget is $9,800."),
)
SYSTEM = ("You turn structured travel requests into one natural request a traveller would write. State every field "
          "(origin, destination, number of days and cities, dates, people, budget and every constraint) and "
          "nothing else. Reply with the request text only.")


def back_translation_messages(fields: dict, shots: int = 3) -> list[dict]:
    """The few-shot chat asking an LLM to write the query text for `fields`."""
    keys = ("org", "dest", "days", "visiting_city_number", "date", "people_number", "local_constraint", "budget")
    messages = [{"role": "system", "content": SYSTEM}]
    for example, text in FEW_SHOT[:shots]:
        messages.append({"role": "user", "content": json.dumps(example)})
        messages.append({"role": "assistant", "content": text})
    messages.append({"role": "user", "content": json.dumps({k: fields[k] for k in keys})})
    return messages


def back_translate(client: Any, fields: dict, shots: int = 3, max_tokens: int = 256) -> str | None:
    """The LLM's query text, or None when it answered nothing usable (the caller falls back to a template)."""
    result = client.complete(back_translation_messages(fields, shots), max_tokens)
    text = (result.text or "").strip().strip('"').strip()
    return text if text and result.finished else None
