"""The six TravelPlanner tools (Agent-STAR's set) over a `World`, and the inverse of their text rendering.

`call_tool(world, name, arguments)` never raises: a bad call returns a `ToolOutput` with `ok=False` and an
observation telling the agent what was wrong and how to call the tool instead. Results are rendered as compact
tab-separated tables (a title line, a header line with the official column names, one line per row) so that a
small model's observations stay short; `parse_observation` reads such a text back into rows exactly (the
programmatic expert sees the world only through it).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from components.travel.world import World

SEP = "\t"

# tool -> (argument names in order, with the format each expects)
TOOL_ARGUMENTS: dict[str, dict[str, str]] = {
    "SearchFlight": {
        "departure": "the departure city, e.g. \"New York\"",
        "destination": "the destination city",
        "date": "the date as YYYY-MM-DD, e.g. \"2022-03-16\"",
    },
    "GoogleDistanceMatrix": {
        "departure": "the origin city",
        "destination": "the destination city",
        "mode": "\"driving\" (self-driving) or \"taxi\"",
    },
    "SearchAccommodation": {"city": "the city name"},
    "SearchRestaurant": {"city": "the city name"},
    "SearchAttraction": {"city": "the city name"},
    "SearchCity": {"state": "the state name"},
}

TOOL_DESCRIPTIONS = {
    "SearchFlight": "List every flight from a city to another on one date: number, price per person, departure "
                    "and arrival time, elapsed time, distance (miles).",
    "GoogleDistanceMatrix": "Driving or taxi route between two cities: duration, distance and cost (self-driving: "
                            "per car of up to 5 people; taxi: per car of up to 4 people).",
    "SearchAccommodation": "List every accommodation in a city: name, price per night, room type, house rules, "
                           "minimum nights, maximum occupancy, rating.",
    "SearchRestaurant": "List every restaurant in a city: name, average cost per person, cuisines, rating.",
    "SearchAttraction": "List every attraction in a city: name and address.",
    "SearchCity": "List the cities of a state that can be visited.",
}

TOOL_NAMES = tuple(TOOL_ARGUMENTS)

# Rendered columns (official names) and how each value is read back.
COLUMNS: dict[str, tuple[tuple[str, type], ...]] = {
    "SearchFlight": (("Flight Number", str), ("Price", int), ("DepTime", str), ("ArrTime", str),
                     ("ActualElapsedTime", str), ("Distance", float)),
    "SearchAccommodation": (("NAME", str), ("price", float), ("room type", str), ("house_rules", str),
                            ("minimum nights", float), ("maximum occupancy", int), ("review rate number", float)),
    "SearchRestaurant": (("Name", str), ("Average Cost", int), ("Cuisines", str), ("Aggregate Rating", float)),
    "SearchAttraction": (("Name", str), ("Address", str)),
    "SearchCity": (("City", str),),
}

TRANSIENT_ERROR = "Error: {tool} is temporarily unavailable (transient service failure). Retry the same call."
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_DRIVE = re.compile(
    r"(?P<mode>self-driving|taxi), from (?P<origin>.+) to (?P<destination>.+), duration: (?P<duration>.+), "
    r"distance: (?P<distance>.+), cost: (?P<cost>-?\d+)"
)


def _schema(name: str) -> dict:
    properties = {arg: {"type": "string", "description": text} for arg, text in TOOL_ARGUMENTS[name].items()}
    if name == "GoogleDistanceMatrix":
        properties["mode"]["enum"] = ["driving", "taxi"]
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": TOOL_DESCRIPTIONS[name],
            "parameters": {"type": "object", "properties": properties, "required": list(TOOL_ARGUMENTS[name])},
        },
    }


TOOL_SCHEMAS: list[dict] = [_schema(name) for name in TOOL_NAMES]


@dataclass(frozen=True)
class ToolOutput:
    """A tool's observation text, whether the call succeeded, and the world rows behind it."""

    text: str
    ok: bool
    rows: list[dict] = field(default_factory=list)


# --- rendering --------------------------------------------------------------------------------------------
def format_value(value: Any) -> str:
    """One cell: integral floats without ".0" (read back as float by column type), tabs/newlines flattened."""
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)
    return str(value).replace("\t", " ").replace("\n", " ").replace("\r", " ")


def render_table(title: str, columns: tuple[tuple[str, type], ...], rows: list[dict]) -> str:
    """Title line, header line, one tab-separated line per row."""
    names = [name for name, _ in columns]
    lines = [title, SEP.join(names)]
    lines += [SEP.join(format_value(row.get(name)) for name in names) for row in rows]
    return "\n".join(lines)


def drive_text(mode: str, origin: str, destination: str, duration: str, distance: str, cost: int) -> str:
    """The official GoogleDistanceMatrix sentence."""
    label = "self-driving" if mode == "driving" else "taxi"
    return f"{label}, from {origin} to {destination}, duration: {duration}, distance: {distance}, cost: {cost}"


def drive_cost(mode: str, km: float) -> int:
    """Official costs: self-driving int(km * 0.05) per car, taxi int(km) per car."""
    return int(km * 0.05) if mode == "driving" else int(km)


# --- the tools ----------------------------------------------------------------------------------------------
def search_flight(world: World, departure: str, destination: str, date: str) -> ToolOutput:
    if not _DATE.fullmatch(date):
        return _bad_argument("SearchFlight", "date", date)
    rows = world.flights_on(departure, destination, date)
    if rows:
        title = f"Flights from {departure} to {destination} on {date} ({len(rows)}):"
        return ToolOutput(render_table(title, COLUMNS["SearchFlight"], rows), True, rows)
    for city in (departure, destination):
        if world.state_of(city) is None:
            return _unknown_city(world, "SearchFlight", city)
    hint = ""
    dates = world.dates
    if dates and not dates[0] <= date <= dates[-1]:
        hint = f" Flights in this database run from {dates[0]} to {dates[-1]}."
    return ToolOutput(f"There is no flight from {departure} to {destination} on {date}.{hint}", False)


def distance_matrix(world: World, departure: str, destination: str, mode: str) -> ToolOutput:
    mode_key = mode.strip().lower()
    if mode_key in ("self-driving", "self driving", "drive"):
        mode_key = "driving"
    if mode_key not in ("driving", "taxi"):
        return _bad_argument("GoogleDistanceMatrix", "mode", mode)
    route = world.distance(departure, destination)
    if route is None or not route["valid"]:
        for city in (departure, destination):
            if world.state_of(city) is None:
                return _unknown_city(world, "GoogleDistanceMatrix", city)
        why = "no route is known" if route is None or not route["duration"] else f"it takes {route['duration']}"
        return ToolOutput(
            f"No valid information. There is no {mode_key} route from {departure} to {destination} ({why}).", False)
    cost = drive_cost(mode_key, route["km"])
    row = {"mode": "self-driving" if mode_key == "driving" else "taxi", "origin": departure,
           "destination": destination, "duration": route["duration"], "distance": route["distance"], "cost": cost}
    text = drive_text(mode_key, departure, destination, route["duration"], route["distance"], cost)
    return ToolOutput(text, True, [row])


def _city_listing(world: World, tool: str, city: str, rows: list[dict], noun: str) -> ToolOutput:
    if rows:
        title = f"{noun.capitalize()} in {city} ({len(rows)}):"
        return ToolOutput(render_table(title, COLUMNS[tool], rows), True, rows)
    if world.state_of(city) is None:
        return _unknown_city(world, tool, city)
    return ToolOutput(f"There is no {noun.rstrip('s')} in {city}.", False)


def search_accommodation(world: World, city: str) -> ToolOutput:
    return _city_listing(world, "SearchAccommodation", city, world.accommodations_in(city), "accommodations")


def search_restaurant(world: World, city: str) -> ToolOutput:
    return _city_listing(world, "SearchRestaurant", city, world.restaurants_in(city), "restaurants")


def search_attraction(world: World, city: str) -> ToolOutput:
    return _city_listing(world, "SearchAttraction", city, world.attractions_in(city), "attractions")


def search_city(world: World, state: str) -> ToolOutput:
    cities = world.cities_in(state)
    if not cities:
        return ToolOutput(
            f"Unknown state '{state}'. SearchCity takes a state name; known states: {', '.join(world.states)}.",
            False)
    rows = [{"City": c} for c in cities]
    return ToolOutput(render_table(f"Cities in {state} ({len(rows)}):", COLUMNS["SearchCity"], rows), True, rows)


_DISPATCH = {
    "SearchFlight": search_flight,
    "GoogleDistanceMatrix": distance_matrix,
    "SearchAccommodation": search_accommodation,
    "SearchRestaurant": search_restaurant,
    "SearchAttraction": search_attraction,
    "SearchCity": search_city,
}


def _usage(tool: str) -> str:
    args = ", ".join(f'"{a}": {text}' for a, text in TOOL_ARGUMENTS[tool].items())
    return f"{tool} takes {{{args}}}"


def _bad_argument(tool: str, argument: str, value: Any) -> ToolOutput:
    expected = TOOL_ARGUMENTS[tool][argument]
    return ToolOutput(f"Error: invalid argument {argument}={value!r} for {tool}; expected {expected}.", False)


def _unknown_city(world: World, tool: str, city: str) -> ToolOutput:
    """The unknown-city error."""
    return ToolOutput(f"Unknown city '{city}' ({tool}). Use an exact city name; SearchCity(state) lists the cities "
                      "of a state.", False)


def or_list(names: list[str]) -> str:
    """"A", "A or B", "A, B or C"."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def check_arguments(name: str, arguments: Any) -> str | None:
    """None when `arguments` fit the tool's signature, else the error observation."""
    if not isinstance(arguments, dict):
        return f"Error: the arguments of {name} must be a JSON object. {_usage(name)}."
    expected = TOOL_ARGUMENTS[name]
    missing = [a for a in expected if a not in arguments]
    if missing:
        return f"Error: {name} is missing the argument '{missing[0]}'. {_usage(name)}."
    extra = [a for a in arguments if a not in expected]
    if extra:
        return f"Error: {name} has no argument '{extra[0]}'. {_usage(name)}."
    for arg in expected:
        if not isinstance(arguments[arg], str) or not arguments[arg].strip():
            return (f"Error: argument '{arg}' of {name} must be a non-empty string "
                    f"({TOOL_ARGUMENTS[name][arg]}), got {arguments[arg]!r}.")
    return None


def call_tool(world: World, name: str, arguments: Any, rng: Any = None, failure_rate: float = 0.0) -> ToolOutput:
    """Run one tool call. Never raises: every problem becomes an error observation (`ok=False`).

    With `failure_rate > 0` and an `rng` (anything with `.random()`), a call fails transiently with that
    probability, before the lookup, for the environment-stability ablation.
    """
    try:
        if name not in _DISPATCH:
            return ToolOutput(f"Error: unknown tool '{name}'. Available tools: {', '.join(TOOL_NAMES)}.", False)
        problem = check_arguments(name, arguments)
        if problem:
            return ToolOutput(problem, False)
        if failure_rate > 0 and rng is not None and rng.random() < failure_rate:
            return ToolOutput(TRANSIENT_ERROR.format(tool=name), False)
        values = {arg: arguments[arg].strip() for arg in TOOL_ARGUMENTS[name]}
        return _DISPATCH[name](world, **values)
    except Exception as exc:  # a tool must never take the episode down
        return ToolOutput(f"Error: {name} failed on {arguments!r}: {type(exc).__name__}: {exc}", False)


# --- reading observations back ------------------------------------------------------------------------------
def _cast(text: str, kind: type) -> Any:
    if kind is str:
        return text
    if text == "":
        return float("nan") if kind is float else None
    return kind(text)


def parse_observation(tool_name: str, text: str) -> list[dict]:
    """The rows rendered in a tool observation (the inverse of the rendering); [] for errors and empty results.

    SearchFlight, SearchAccommodation, SearchRestaurant, SearchAttraction and SearchCity rows carry the columns
    of `COLUMNS[tool_name]`; a GoogleDistanceMatrix row is {mode, origin, destination, duration, distance, cost}.
    """
    if tool_name == "GoogleDistanceMatrix":
        match = _DRIVE.fullmatch(text.strip())
        if not match:
            return []
        row = match.groupdict()
        row["cost"] = int(row["cost"])
        return [row]
    columns = COLUMNS.get(tool_name, ())
    return [{name: _cast(cell, kind) for (name, kind), cell in zip(columns, cells)}
            for cells in _table_cells(tool_name, text)]


def _table_cells(tool_name: str, text: str) -> list[list[str]]:
    """The cells of each row of `tool_name`'s table in `text` (title, header, rows); [] when it is not one."""
    columns = COLUMNS.get(tool_name)
    lines = text.split("\n")
    if columns is None or len(lines) < 2 or lines[1] != SEP.join(name for name, _ in columns):
        return []
    return [cells for cells in (line.split(SEP) for line in lines[2:]) if len(cells) == len(columns)]


LISTING_TOOLS = ("SearchAccommodation", "SearchRestaurant", "SearchAttraction")
"""The tools whose rows are named listings: the names a plan must copy exactly."""


def listing_names(observation: str) -> list[str]:
    """The names (first column) in a rendered accommodation, restaurant or attraction table; [] for anything else.

    `observation` is the tool's text or the user message that carries it (`<tool_response>` ... `</tool_response>`).
    """
    text = observation.strip()
    if text.startswith("<tool_response>") and text.endswith("</tool_response>"):
        text = text[len("<tool_response>"):-len("</tool_response>")].strip("\n")
    for tool in LISTING_TOOLS:
        rows = _table_cells(tool, text)
        if rows:
            return [cells[0] for cells in rows if cells[0]]
    return []


def project_row(tool_name: str, row: dict) -> dict:
    """The part of a world row that a tool renders (what `parse_observation` gives back)."""
    if tool_name == "GoogleDistanceMatrix":
        return dict(row)
    return {name: row[name] for name, _ in COLUMNS[tool_name]}
