"""What both evaluator modes share: check results and plan evaluations, the check names, the per-world name
lookups, and the context a check reads."""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

from components.travel.tasks import Query

MODES = ("official", "strict")

COMMONSENSE_CHECKS = (
    "is_valid_information_in_current_city",
    "is_valid_information_in_sandbox",
    "is_reasonable_visiting_city",
    "is_valid_restaurants",
    "is_valid_attractions",
    "is_valid_transportation",
    "is_valid_accommodation",
    "is_not_absent",
)

HARD_CHECKS = ("valid_cost", "valid_room_rule", "valid_room_type", "valid_cuisine", "valid_transportation")

HARD_CONSTRAINT_KEY = {
    "valid_room_rule": "house rule",
    "valid_room_type": "room type",
    "valid_cuisine": "cuisine",
    "valid_transportation": "transportation",
}

ROOM_TYPE_OF = {"entire room": "Entire home/apt", "private room": "Private room", "shared room": "Shared room"}

UNFILLED_DAY = "You don't need to fill in the information for this or later days."

@dataclass(frozen=True)
class CheckResult:
    """One check's outcome: status "pass" | "fail" | "n/a" and why."""

    status: str
    reason: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    @property
    def failed(self) -> bool:
        return self.status == "fail"

PASS = CheckResult("pass")

NOT_APPLICABLE = CheckResult("n/a", "the query does not set this constraint")

def fail(reason: str) -> CheckResult:
    return CheckResult("fail", reason)

@dataclass
class PlanEvaluation:
    """Every check of one plan, in one mode."""

    mode: str
    delivered: bool
    commonsense: dict[str, CheckResult]
    hard: dict[str, CheckResult]
    total_cost: float | None = None
    plan_error: str | None = None

    @property
    def commonsense_pass(self) -> bool:
        return self.delivered and all(r.passed for r in self.commonsense.values())

    @property
    def hard_pass(self) -> bool:
        return self.delivered and not any(r.failed for r in self.hard.values())

    @property
    def final_pass(self) -> bool:
        return self.commonsense_pass and self.hard_pass

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "delivered": self.delivered,
            "final_pass": self.final_pass,
            "total_cost": self.total_cost,
            "plan_error": self.plan_error,
            "commonsense": {k: {"status": r.status, "reason": r.reason} for k, r in self.commonsense.items()},
            "hard": {k: {"status": r.status, "reason": r.reason} for k, r in self.hard.items()},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PlanEvaluation":
        def checks(block: dict) -> dict[str, CheckResult]:
            return {k: CheckResult(v["status"], v.get("reason", "")) for k, v in block.items()}

        return cls(mode=data["mode"], delivered=data["delivered"], commonsense=checks(data["commonsense"]),
                   hard=checks(data["hard"]), total_cost=data.get("total_cost"), plan_error=data.get("plan_error"))

LOOKUP_TABLES = {
    "restaurant": ("restaurants_in", "Name"),
    "attraction": ("attractions_in", "Name"),
    "accommodation": ("accommodations_in", "NAME"),
}

_LOOKUPS: dict[int, tuple[weakref.ref, "NameLookup"]] = {}

class NameLookup:
    """Name -> rows within one city, as the official substring match and as the strict exact match."""

    def __init__(self, world: Any):
        self._world_ref = weakref.ref(world)
        self._official: dict[tuple[str, str, str], list[dict]] = {}
        self._strict: dict[tuple[str, str], dict[str, list[dict]]] = {}

    def official(self, kind: str, name: str, city: str) -> list[dict]:
        """Rows of `city` whose name contains `name` (case-sensitive), as `df[Name.str.contains(name) & City==city]`."""
        key = (kind, name, city)
        hit = self._official.get(key)
        if hit is None:
            getter, column = LOOKUP_TABLES[kind]
            rows = getattr(self._world_ref(), getter)(city)
            hit = [row for row in rows if name in str(row[column])]
            self._official[key] = hit
        return hit

    def strict(self, kind: str, name: str, city: str) -> list[dict]:
        """Rows of `city` whose name equals `name` (exactly, else ignoring case and repeated spaces)."""
        index = self._strict.get((kind, city))
        if index is None:
            getter, column = LOOKUP_TABLES[kind]
            index = {}
            for row in getattr(self._world_ref(), getter)(city):
                text = str(row[column]).strip()
                index.setdefault(text, []).append(row)
                folded = _fold(text)
                if folded != text:
                    index.setdefault(folded, []).append(row)
            self._strict[(kind, city)] = index
        return index.get(name.strip()) or index.get(_fold(name), [])

def _fold(text: str) -> str:
    return "\x00" + " ".join(text.split()).casefold()

def lookup_for(world: Any) -> NameLookup:
    """The cached `NameLookup` of `world` (keyed by identity; dropped when the world is collected)."""
    entry = _LOOKUPS.get(id(world))
    if entry is not None and entry[0]() is world:
        return entry[1]
    lookup = NameLookup(world)
    key = id(world)
    _LOOKUPS[key] = (weakref.ref(world, lambda _ref, key=key: _LOOKUPS.pop(key, None)), lookup)
    return lookup

@dataclass
class Context:
    world: Any
    query: Query
    plan: list[dict]
    lookup: NameLookup
    total_cost: float | None = None
    cache: dict = field(default_factory=dict)

    @property
    def days(self) -> list[tuple[int, dict]]:
        """(1-based day, day dict) for the days the official code reads: the first `query.days` entries."""
        return list(enumerate(self.plan[: self.query.days], start=1))

def _filled(unit: dict, key: str) -> bool:
    """The official `key in unit and unit[key] and unit[key] != '-'`."""
    return key in unit and bool(unit[key]) and unit[key] != "-"

def is_valid_city_sequence(city_list: list[str]) -> bool:
    """Every city except the first and last appears in one contiguous block of length >= 2 (official rule)."""
    if len(city_list) < 3:
        return False
    visited: set[str] = set()
    i = 0
    while i < len(city_list):
        city = city_list[i]
        if city in visited and i not in (0, len(city_list) - 1):
            return False
        count = 0
        while i < len(city_list) and city_list[i] == city:
            count += 1
            i += 1
        if count == 1 and 0 < i - 1 < len(city_list) - 1:
            return False
        visited.add(city)
    return True

def consecutive_runs(values: list) -> list[tuple[Any, int]]:
    """Runs of equal consecutive values: ['a', 'a', 'b'] -> [('a', 2), ('b', 1)]."""
    runs: list[tuple[Any, int]] = []
    for value in values:
        if runs and runs[-1][0] == value:
            runs[-1] = (value, runs[-1][1] + 1)
        else:
            runs.append((value, 1))
    return runs
