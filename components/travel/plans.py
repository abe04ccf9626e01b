"""Plan parsing and the small string grammars inside a plan.

`parse_plan` turns whatever an agent (or a file) gives into a list of day dicts with the official keys, or says why
it cannot; it never raises. `normalize=True` (the default) also removes the junk real models add to field values
("; Cost: 14", ", Cost: 321 for 3 nights", "Price: 1109") so that a plan is judged on its choices, not its
formatting; pass `normalize=False` to score plans exactly as the public evaluator would see them.
"""
from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any

PLAN_FIELDS = ("days", "current_city", "transportation", "breakfast", "attraction", "lunch", "dinner",
               "accommodation")
MEAL_FIELDS = ("breakfast", "lunch", "dinner")
EMPTY_VALUES = ("", "-")

_FENCE = re.compile(r"```(?:json|python|JSON)?\s*(.*?)```", re.DOTALL)
_COST_SUFFIX = re.compile(r"\s*[;,]\s*(?:cost|price|total cost|estimated cost)\s*:.*$", re.IGNORECASE | re.DOTALL)
_FROM_TO = re.compile(r"from\s+(.+?)\s+to\s+([^,]+)(?=[,\s]|$)")
_STRICT_FROM_TO = re.compile(r"\bfrom\s+(.+?)\s+to\s+(.+?)\s*(?:,|;|$)", re.IGNORECASE)
_FLIGHT_NUMBER = re.compile(r"\bF\d+\b")
_PARENTHESIS = re.compile(r"^(.*?)\([^)]*\)")
_OFFICIAL_NAME_CITY = re.compile(r"(.*?),\s*([^,]+)(\(\w[\w\s]*\))?$")
_TIME = re.compile(r"(departure|arrival)\s+time\s*:\s*(\d{1,2}:\d{2})", re.IGNORECASE)


def parse_plan(obj_or_text: Any, normalize: bool = True, raw: bool = False) -> tuple[list[dict] | None, str | None]:
    """Parse a plan from a list, a JSON/Python-literal string, or text with prose/code fences around it.

    Returns `(plan, None)` or `(None, reason)`; never raises. Day dicts get the official keys (`day` becomes
    `days`); trailing empty `{}` days are dropped; non-dict items are an error; `normalize` also strips cost
    suffixes. With `raw` (`star evaluate --raw`) it returns the decoded days exactly as written.
    """
    try:
        candidate = _decode(obj_or_text)
        if isinstance(candidate, str):
            return None, candidate
        return _to_plan(candidate, normalize, raw)
    except Exception as exc:  # noqa: BLE001 - the contract is "never raises": any surprise becomes a reason
        return None, f"unparseable plan ({type(exc).__name__}: {exc})"


def _decode(obj: Any) -> Any:
    """The Python object a plan was written as; a str result is an error message."""
    if isinstance(obj, (list, tuple)):
        return list(obj)
    if isinstance(obj, dict):
        for key in ("plan", "days", "itinerary"):
            if isinstance(obj.get(key), list):
                return obj[key]
        return [obj]
    if obj is None:
        return "no plan given"
    if isinstance(obj, bytes):
        obj = obj.decode("utf-8", errors="replace")
    if not isinstance(obj, str):
        return f"a plan must be a list of day objects, got {type(obj).__name__}"
    text = obj.strip()
    if not text:
        return "the plan is empty"
    for chunk in _candidate_texts(text):
        value = _literal(chunk)
        if isinstance(value, (list, dict)):
            return _decode(value)
    return "no JSON list of day objects found in the answer"


def _candidate_texts(text: str) -> list[str]:
    """Whole text, fenced blocks, then the outermost [...] span (prose around the plan)."""
    chunks = [text, *(m.group(1).strip() for m in _FENCE.finditer(text))]
    start, end = text.find("["), text.rfind("]")
    if 0 <= start < end:
        chunks.append(text[start:end + 1])
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        chunks.append("[" + text[start:end + 1] + "]")
    return chunks


def _literal(text: str) -> Any:
    if len(text) > 2_000_000:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def _to_plan(items: list, normalize: bool, raw: bool = False) -> tuple[list[dict] | None, str | None]:
    if raw:  # the days exactly as written (empty days, key case and list values included)
        if not items:
            return None, "the plan has no days"
        for position, item in enumerate(items, start=1):
            if not isinstance(item, dict):
                return None, f"day {position} is a {type(item).__name__}, not an object with the plan fields"
        return list(items), None
    while items and not _is_day(items[-1]):  # trailing {} days, cost summaries, closing notes
        items = items[:-1]
    if not items:
        return None, "the plan has no days"
    plan = []
    for position, item in enumerate(items, start=1):
        if not isinstance(item, dict):
            return None, f"day {position} is a {type(item).__name__}, not an object with the plan fields"
        plan.append(_to_day(item, normalize))
    return plan, None


def _is_day(item: Any) -> bool:
    """A dict with at least one plan field (`day` counts): what a day of the plan looks like."""
    return isinstance(item, dict) and any(str(key).strip().lower() in (*PLAN_FIELDS, "day") for key in item)


def _to_day(item: dict, normalize: bool) -> dict:
    day = {}
    for key, value in item.items():
        key = str(key).strip()
        key = "days" if key.lower() in ("day", "days") else key.lower() if key.lower() in PLAN_FIELDS else key
        day[key] = value
    for field in PLAN_FIELDS[1:]:
        if field in day:
            day[field] = _as_text(day[field])
    if normalize:
        for field in (*MEAL_FIELDS, "accommodation"):
            if isinstance(day.get(field), str):
                day[field] = strip_cost_suffix(day[field])
        if isinstance(day.get("attraction"), str):
            day["attraction"] = normalize_attractions(day["attraction"])
    return day


def _as_text(value: Any) -> Any:
    """Lists of places ("attraction": ["A, X", "B, X"]) become the official ';'-joined text; None stays None."""
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return "".join(f"{v.strip()};" for v in value if v.strip()) or "-"
    return value


def strip_cost_suffix(value: str) -> str:
    """'Name, City; Cost: 14' and 'Name, City, Cost: 321 for 3 nights' -> 'Name, City'."""
    return _COST_SUFFIX.sub("", value).strip()


def normalize_attractions(value: str) -> str:
    """Strip cost suffixes per item and end the list with ';' as the official format does."""
    if value.strip() in EMPTY_VALUES:
        return value.strip()
    items = [strip_cost_suffix(item) for item in value.split(";")]
    items = [item for item in items if item]
    return "".join(f"{item};" for item in items) if items else "-"


# ---- field grammars -------------------------------------------------------------------------------------------

def is_empty(value: Any) -> bool:
    """A field that holds no choice: missing, None, '' or '-'."""
    return value is None or (isinstance(value, str) and value.strip() in EMPTY_VALUES)


def extract_before_parenthesis(text: str) -> str:
    """'Dallas(Texas)' -> 'Dallas' (the official helper)."""
    match = _PARENTHESIS.search(text)
    return match.group(1) if match else text


def official_name_city(text: str) -> tuple[str, str]:
    """The official `get_valid_name_city`: name = text before the LAST comma; ('-', '-') when there is no comma."""
    match = _OFFICIAL_NAME_CITY.search(text)
    if not match:
        return "-", "-"
    return match.group(1).strip(), extract_before_parenthesis(match.group(2).strip()).strip()


def split_name_city(text: str) -> tuple[str, str] | None:
    """'Name, with comma, City' -> ('Name, with comma', 'City'); None when there is no comma or an empty side."""
    if not isinstance(text, str) or "," not in text:
        return None
    name, _, city = text.rpartition(",")
    name, city = name.strip(), extract_before_parenthesis(city.strip()).strip()
    return (name, city) if name and city else None


def split_attractions(text: str) -> list[str]:
    """Every ';'-separated attraction item, stripped, empty items dropped (strict reading)."""
    if is_empty(text) or not isinstance(text, str):
        return []
    return [item.strip() for item in text.split(";") if item.strip()]


def official_attraction_items(text: str) -> list[str]:
    """The official reading `text.split(';')[:-1]`: the last item is dropped (unchecked if ';' is missing)."""
    return text.split(";")[:-1]


def official_from_to(text: str) -> tuple[str | None, str | None]:
    """The official `extract_from_to` regex (case-sensitive 'from ... to ...')."""
    match = _FROM_TO.search(text) if isinstance(text, str) else None
    return match.groups() if match else (None, None)


def from_to(text: str) -> tuple[str, str] | None:
    """'from A to B, ...' -> (A, B) with parentheses removed, case-insensitive keywords; None if absent."""
    if not isinstance(text, str):
        return None
    match = _STRICT_FROM_TO.search(text)
    if not match:
        return None
    origin = extract_before_parenthesis(match.group(1)).strip()
    dest = extract_before_parenthesis(match.group(2)).strip()
    return (origin, dest) if origin and dest else None


@dataclass(frozen=True)
class Transport:
    """One parsed transportation value."""

    mode: str  # "flight", "self-driving", "taxi", "none" ('-') or "unknown"
    origin: str | None
    dest: str | None
    flight_number: str | None = None
    departure_time: str | None = None
    arrival_time: str | None = None


def official_mode(text: str) -> str | None:
    """The official `transportation_match`: 'Taxi', 'Self-driving', 'Flight' (lower-cased search) or None."""
    lowered = text.lower()
    if "taxi" in lowered:
        return "Taxi"
    if "self-driving" in lowered:
        return "Self-driving"
    if "flight" in lowered:
        return "Flight"
    return None


def parse_transport(text: Any) -> Transport:
    """Parse 'Flight Number: F0123456, from A to B, Departure Time: ..', 'Self-driving, from A to B, ..', 'Taxi, ..'."""
    if is_empty(text):
        return Transport("none", None, None)
    if not isinstance(text, str):
        return Transport("unknown", None, None)
    lowered = text.lower()
    leg = from_to(text)
    origin, dest = leg if leg else (None, None)
    number = _FLIGHT_NUMBER.search(text)
    if "flight" in lowered or number:
        times = {kind.lower(): value.zfill(5) for kind, value in _TIME.findall(text)}
        return Transport("flight", origin, dest, number.group(0) if number else None,
                         times.get("departure"), times.get("arrival"))
    if "self-driving" in lowered or "self driving" in lowered:
        return Transport("self-driving", origin, dest)
    if "taxi" in lowered:
        return Transport("taxi", origin, dest)
    return Transport("unknown", origin, dest)


def current_cities(current_city: Any) -> list[str] | None:
    """'A' -> [A]; 'from A to B' -> [A, B]; None when a 'from' value cannot be read."""
    if not isinstance(current_city, str) or not current_city.strip():
        return None
    if re.search(r"\bfrom\b", current_city, re.IGNORECASE):
        leg = from_to(current_city)
        return list(leg) if leg else None
    return [extract_before_parenthesis(current_city).strip()]
