"""The TravelPlanner evaluator: 8 commonsense and 5 hard checks, in two modes.

- `official` reproduces the public evaluator (`commonsense_constraint.py` / `hard_constraint.py`) rule by rule,
  quirks included, so our numbers compare with published ones; where the public code would crash on a malformed
  plan, the affected check fails with the reason instead.
- `strict` (the default, used for rewards) fixes every quirk: every attraction and every day's city are checked,
  flights must exist on the day's date and leg, transport modes are detected case-insensitively and unknown ones
  fail, names must match a listing exactly and ambiguous names are resolved to the worst case.

Every lookup goes through the World's indexes (rows of one city), with a lazily filled per-world cache of name
matches; nothing scans a table.
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

from components.travel.plans import (
    MEAL_FIELDS,
    Transport,
    PLAN_FIELDS,
    current_cities,
    extract_before_parenthesis,
    is_empty,
    official_attraction_items,
    official_from_to,
    official_mode,
    official_name_city,
    parse_plan,
    parse_transport,
    split_attractions,
    split_name_city,
)
from components.travel.queries import Query

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


# ---- per-world name lookups (lazy, cached beside the world, never on it) --------------------------------------

_TABLES = {
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
            getter, column = _TABLES[kind]
            rows = getattr(self._world_ref(), getter)(city)
            hit = [row for row in rows if name in str(row[column])]
            self._official[key] = hit
        return hit

    def strict(self, kind: str, name: str, city: str) -> list[dict]:
        """Rows of `city` whose name equals `name` (exactly, else ignoring case and repeated spaces)."""
        index = self._strict.get((kind, city))
        if index is None:
            getter, column = _TABLES[kind]
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


# ---- entry point -----------------------------------------------------------------------------------------------

def evaluate_plan(world: Any, query: Query, plan: Any, mode: str = "strict", lookup: Any = None) -> PlanEvaluation:
    """Score one plan against its query in `mode` ("strict" or "official"); never raises on a bad plan.

    `lookup` replaces the cached per-world `NameLookup` (same two methods); the benchmark passes a pandas one.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if _is_absent(plan):
        return _undelivered(query, mode, "no plan delivered")
    days, error = _as_days(plan)
    if days is None:  # text that is not a plan delivers nothing (an absent plan is not delivered)
        return _undelivered(query, mode, f"no plan delivered: {error}")
    ctx = _Context(world, query, days, lookup or lookup_for(world))
    checks = OFFICIAL_COMMONSENSE if mode == "official" else STRICT_COMMONSENSE
    commonsense = {name: _guarded(checks[name], ctx) for name in COMMONSENSE_CHECKS}
    total_cost = None
    if commonsense["is_not_absent"].passed and commonsense["is_valid_information_in_sandbox"].passed:
        hard_checks = OFFICIAL_HARD if mode == "official" else STRICT_HARD
        hard = {}
        for name in HARD_CHECKS:
            if name != "valid_cost" and query.local_constraint.get(HARD_CONSTRAINT_KEY[name]) in (None, []):
                hard[name] = NOT_APPLICABLE
            else:
                hard[name] = _guarded(hard_checks[name], ctx)
        total_cost = ctx.total_cost
    else:
        hard = _gated_hard(query, "not evaluated: complete information and within-sandbox must pass first")
    return PlanEvaluation(mode, True, commonsense, hard, total_cost, None)


def _is_absent(plan: Any) -> bool:
    """No plan: None, or an empty list/str/dict (the official `if plan:`), without trusting `bool()` of odd types."""
    try:
        if isinstance(plan, (bool, int, float)):
            return not plan
        return plan is None or (isinstance(plan, (list, tuple, str, dict, bytes)) and len(plan) == 0)
    except TypeError:
        return False


def _as_days(plan: Any) -> tuple[list[dict] | None, str | None]:
    if isinstance(plan, list) and all(isinstance(day, dict) for day in plan):
        return plan, None
    return parse_plan(plan, normalize=False)


def _undelivered(query: Query, mode: str, reason: str) -> PlanEvaluation:
    commonsense = {name: fail(reason) for name in COMMONSENSE_CHECKS}
    return PlanEvaluation(mode, False, commonsense, _gated_hard(query, reason), None, reason)


def _gated_hard(query: Query, reason: str) -> dict[str, CheckResult]:
    out = {}
    for name in HARD_CHECKS:
        applicable = name == "valid_cost" or query.local_constraint.get(HARD_CONSTRAINT_KEY[name]) not in (None, [])
        out[name] = fail(reason) if applicable else NOT_APPLICABLE
    return out


def _guarded(check: Callable[["_Context"], CheckResult], ctx: "_Context") -> CheckResult:
    """Run a check; a malformed plan that trips it (where the public code crashes) fails it with the reason."""
    try:
        return check(ctx)
    except Exception as exc:  # noqa: BLE001 - any crash on plan content is that plan's failure, not ours
        return fail(f"malformed plan: {type(exc).__name__}: {exc}")


@dataclass
class _Context:
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


# =================================================================================================================
# official mode: the public evaluator, rule by rule
# =================================================================================================================

def _filled(unit: dict, key: str) -> bool:
    """The official `key in unit and unit[key] and unit[key] != '-'`."""
    return key in unit and bool(unit[key]) and unit[key] != "-"


def _official_city_sequence(ctx: _Context) -> tuple[list[str] | None, str | None]:
    city_list: list[str] = []
    for i, unit in ctx.days:
        value = unit["current_city"]
        if "from" in value:
            city1, city2 = official_from_to(value)
            if city1 is None:
                return None, f"day {i}: current_city {value!r} cannot be read as 'from A to B'"
            city1, city2 = extract_before_parenthesis(city1), extract_before_parenthesis(city2)
            if i == 1 and city1 != ctx.query.org:
                return None, f"The first day's city should be {ctx.query.org}."
            city_list += [city1, city2]
        else:
            city_list.append(extract_before_parenthesis(value))
    return city_list, None


def _is_valid_city_sequence(city_list: list[str]) -> bool:
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


def official_reasonable_visiting_city(ctx: _Context) -> CheckResult:
    city_list, error = _official_city_sequence(ctx)
    if error:
        return fail(error)
    if not city_list:
        return fail("the plan has no days to read cities from")
    if city_list[0] != city_list[-1]:
        return fail("The trip should be a closed circle.")
    if not _is_valid_city_sequence(city_list):
        return fail("The city sequence is invalid.")
    for position, city in enumerate(city_list):
        state = ctx.world.state_of(city)
        if state is None:
            return fail(f"{city} is not a valid city.")
        if position not in (0, len(city_list) - 1) and ctx.query.days > 3 and state != ctx.query.dest:
            return fail(f"{city} is not in {ctx.query.dest}.")
    return PASS


def official_restaurants(ctx: _Context) -> CheckResult:
    seen: list = []
    for i, unit in ctx.days:
        for meal in MEAL_FIELDS:
            if _filled(unit, meal):
                if unit[meal] in seen:
                    return fail(f"The restaurant in day {i} {meal} is repeated.")
                seen.append(unit[meal])
    return PASS


def official_attractions(ctx: _Context) -> CheckResult:
    seen: list = []
    for i, unit in ctx.days:
        if _filled(unit, "attraction"):
            for attraction in official_attraction_items(unit["attraction"]):
                if attraction in seen:
                    return fail(f"The attraction '{attraction}' in day {i} is repeated.")
                seen.append(attraction)
    return PASS


def official_transportation(ctx: _Context) -> CheckResult:
    first = ctx.plan[0]["transportation"]
    if not first or first == "-":
        return fail("The transportation in day 1 should not be empty.")
    modes = [official_mode(first)]
    for _, unit in ctx.days:
        if _filled(unit, "transportation"):
            modes.append(official_mode(unit["transportation"]))
    if ("Self-driving" in modes and "Flight" in modes) or ("Taxi" in modes and "Self-driving" in modes):
        return fail("The transportation is conflicting.")
    return PASS


def official_current_city(ctx: _Context) -> CheckResult:
    for i, unit in ctx.days:
        current_city = unit["current_city"]
        if "from" in current_city:
            city1, city2 = official_from_to(current_city)
            if city1 is None:
                return fail(f"day {i}: current_city {current_city!r} cannot be read as 'from A to B'")
            cities: Any = [extract_before_parenthesis(city1), extract_before_parenthesis(city2)]
        else:
            # Official quirk: a plain string, so the loops below iterate its characters.
            cities = extract_before_parenthesis(current_city)
        if _filled(unit, "transportation"):
            for city in cities:
                if city not in unit["transportation"]:
                    return fail(f"The transportation in day {i} is invalid city choice.")
        for key in (*MEAL_FIELDS,):
            if _filled(unit, key) and not any(city in unit[key] for city in cities):
                return fail(f"The {key} in day {i} is invalid city choice.")
        if _filled(unit, "attraction"):
            for attraction in official_attraction_items(unit["attraction"]):
                if not any(city in attraction for city in cities):
                    return fail(f"The attraction in day {i} is invalid city choice.")
        if _filled(unit, "accommodation") and cities[-1] not in unit["accommodation"]:
            return fail(f"The accommodation in day {i} is invalid city choice.")
    return PASS


def _official_leg(unit: dict) -> tuple[str | None, str | None]:
    org, dest = official_from_to(unit["transportation"])
    if org is None or dest is None:
        org, dest = official_from_to(unit["current_city"])
    return org, dest


def _official_flight_number(value: str) -> str:
    return value.split("Flight Number: ")[1].split(",")[0]


def _official_route_cost(ctx: _Context, org: str, dest: str, mode: str) -> int | None:
    """The official `run_for_evaluation(...)['cost']`: None for a missing/invalid (multi-day) route."""
    route = ctx.world.distance(extract_before_parenthesis(org), extract_before_parenthesis(dest))
    if route is None or not route.get("valid") or route.get("km") is None:
        return None
    return int(route["km"] * 0.05) if mode == "self-driving" else int(route["km"])


def official_sandbox(ctx: _Context) -> CheckResult:
    for i, unit in ctx.days:
        if unit["transportation"] and unit["transportation"] != "-":
            value = unit["transportation"]
            org, dest = _official_leg(unit)
            if "flight number" in value.lower():
                if org is None or dest is None:
                    return fail(f"The transportation {value} in day {i} can not be parsed.")
                row = ctx.world.flight(_official_flight_number(value))
                if (row is None or row["OriginCityName"] != extract_before_parenthesis(org)
                        or row["DestCityName"] != extract_before_parenthesis(dest)):
                    return fail(f"The flight number in day {i} is invalid in the sandbox.")
            elif "self-driving" in value.lower() or "taxi" in value.lower():
                org, dest = (org, dest) if org is not None and dest is not None else ("-", "-")
                mode = "self-driving" if "self-driving" in value.lower() else "taxi"
                if _official_route_cost(ctx, org, dest, mode) is None:
                    return fail(f"The {mode} in day {i} is invalid in the sandbox.")
            # Official quirk: any other transport text ("Driving", "Rental Car") is not checked at all.
        for meal in MEAL_FIELDS:
            if _filled(unit, meal):
                name, city = official_name_city(unit[meal])
                if not ctx.lookup.official("restaurant", name, city):
                    return fail(f"The {meal} in day {i} is invalid in the sandbox.")
        if _filled(unit, "attraction"):
            for attraction in official_attraction_items(unit["attraction"]):
                name, city = official_name_city(attraction)
                if not ctx.lookup.official("attraction", name, city):
                    return fail(f"The attraction {attraction} in day {i} is invalid in the sandbox.")
        if _filled(unit, "accommodation"):
            name, city = official_name_city(unit["accommodation"])
            if not ctx.lookup.official("accommodation", name, city):
                return fail(f"The accommodation in day {i} is invalid in the sandbox.")
    return PASS


def _consecutive(values: list) -> list[tuple[Any, int]]:
    """Runs of equal consecutive values: ['a', 'a', 'b'] -> [('a', 2), ('b', 1)]."""
    runs: list[tuple[Any, int]] = []
    for value in values:
        if runs and runs[-1][0] == value:
            runs[-1] = (value, runs[-1][1] + 1)
        else:
            runs.append((value, 1))
    return runs


def official_accommodation(ctx: _Context) -> CheckResult:
    stays = []
    for _, unit in ctx.days:
        if "accommodation" not in unit:
            return fail("No Accommodation Info.")
        stays.append(unit["accommodation"])
    for value, nights in _consecutive(stays):
        if value not in ("-", ""):
            name, city = official_name_city(value)
            rows = ctx.lookup.official("accommodation", name, city)
            # Official quirk: the rule is only enforced when the name matches exactly one listing.
            if len(rows) == 1 and nights < rows[0]["minimum nights"]:
                return fail(f"The accommodation {value} do not obey the minumum nights rule.")
    return PASS


def _official_valid_days(ctx: _Context) -> bool:
    count = sum(1 for _, unit in ctx.days if unit != {} and unit["current_city"] != UNFILLED_DAY)
    return count == ctx.query.days


def _official_visiting_city_number(ctx: _Context) -> bool:
    cities: set[str] = set()
    for i, unit in ctx.days:
        value = unit["current_city"]
        if "from" in value:
            city1, city2 = official_from_to(value)
            city1, city2 = extract_before_parenthesis(city1), extract_before_parenthesis(city2)
            if i == 1 and city1 != ctx.query.org:
                return False
            cities.update((city1, city2))
        else:
            cities.add(extract_before_parenthesis(value))
    cities.discard(ctx.query.org)
    return len(cities) == ctx.query.visiting_city_number


def official_not_absent(ctx: _Context) -> CheckResult:
    if not _official_valid_days(ctx):
        return fail("Invalid Days")
    if not _official_visiting_city_number(ctx):
        return fail("Invalid City Number")
    needed, filled = 6 * ctx.query.days, 0
    for i, unit in ctx.days:
        for key, label in (("transportation", "Transportation"), ("breakfast", "Breakfast"), ("lunch", "Lunch"),
                           ("dinner", "Dinner"), ("attraction", "Attraction"), ("accommodation", "Accommodation")):
            if key not in unit:
                return fail(f"No {label} Info.")
        city = unit["current_city"]
        if ("from " in city or "to " in city) and unit["transportation"] in ("", "-"):
            return fail(f"No transportation in day {i} is not allowed.")
        if "from " not in city and " to " not in city and unit["attraction"] in ("", "-"):
            return fail(f"No attaction in day {i} is not allowed.")
        if i != ctx.query.days and unit["accommodation"] in ("", "-"):
            return fail(f"No accommodation in day {i} is not allowed.")
        if any(unit[meal] in ("", "-") for meal in MEAL_FIELDS) and "from " not in city:
            return fail(f"No meal in day {i} is not allowed.")
        filled += sum(1 for key in unit if unit[key] and unit[key] != "-")
    if filled / needed < 0.5:
        return fail("The absent information is more than 50%.")
    return PASS


def _official_first_row(ctx: _Context, kind: str, value: str) -> dict | None:
    name, city = official_name_city(value)
    rows = ctx.lookup.official(kind, name, city)
    return rows[0] if rows else None


def official_cost(ctx: _Context) -> CheckResult:
    people = ctx.query.people_number
    total = 0.0
    for _, unit in ctx.days:
        if unit["transportation"] and unit["transportation"] != "-":
            value = unit["transportation"]
            org, dest = _official_leg(unit)
            if org is not None and dest is not None:
                if "flight number" in value.lower():
                    row = ctx.world.flight(_official_flight_number(value))
                    if row is not None:
                        total += row["Price"] * people
                elif "self-driving" in value.lower():
                    total += _official_route_cost(ctx, org, dest, "self-driving") * math.ceil(people / 5)
                elif "taxi" in value.lower():
                    total += _official_route_cost(ctx, org, dest, "taxi") * math.ceil(people / 4)
                # Official quirk: an unknown transport text costs nothing.
        for meal in MEAL_FIELDS:
            if unit[meal] and unit[meal] != "-":
                row = _official_first_row(ctx, "restaurant", unit[meal])
                if row is not None:
                    total += row["Average Cost"] * people
        if unit["accommodation"] and unit["accommodation"] != "-":
            row = _official_first_row(ctx, "accommodation", unit["accommodation"])
            if row is not None:
                total += row["price"] * math.ceil(people / row["maximum occupancy"])
    ctx.total_cost = total
    if total <= ctx.query.budget:
        return CheckResult("pass", f"total cost {total:g} <= budget {ctx.query.budget}")
    return fail(f"total cost {total:g} exceeds the budget {ctx.query.budget}")


def official_room_rule(ctx: _Context) -> CheckResult:
    rule = ctx.query.house_rule
    for _, unit in ctx.days:
        if unit["accommodation"] and unit["accommodation"] != "-":
            row = _official_first_row(ctx, "accommodation", unit["accommodation"])
            if row is not None:
                rules = str(row["house_rules"])
                # As the public hard_constraint.py: "parties" is enforced (the annotation tool's utils/func.py spells
                # it 'parities', which is not the evaluator).
                for wanted, forbidden in (("smoking", "No smoking"), ("parties", "No parties"),
                                          ("children under 10", "No children under 10"),
                                          ("visitors", "No visitors"), ("pets", "No pets")):
                    if rule == wanted and forbidden in rules:
                        return fail(f"The house rule should be {rule}.")
    return PASS


def official_room_type(ctx: _Context) -> CheckResult:
    wanted = ctx.query.room_type
    for _, unit in ctx.days:
        if unit["accommodation"] and unit["accommodation"] != "-":
            row = _official_first_row(ctx, "accommodation", unit["accommodation"])
            if row is not None:
                room = row["room type"]
                if ((wanted == "not shared room" and room == "Shared room")
                        or (wanted in ROOM_TYPE_OF and room != ROOM_TYPE_OF[wanted])):
                    return fail(f"The room type should be {wanted}.")
    return PASS


def official_cuisine(ctx: _Context) -> CheckResult:
    wanted = ctx.query.cuisine or []
    served: set[str] = set()
    for _, unit in ctx.days:
        for meal in MEAL_FIELDS:
            if unit[meal] and unit[meal] != "-":
                name, city = official_name_city(unit[meal])
                if city == ctx.query.org:
                    break  # Official quirk: `continue` on the day loop skips the day's remaining meals.
                rows = ctx.lookup.official("restaurant", name, city)
                if rows:
                    cuisines = rows[0]["Cuisines"]
                    served.update(c for c in wanted if c in cuisines)
    missing = [c for c in wanted if c not in served]
    return fail(f"The cuisine {missing[0]} is not satisfied.") if missing else PASS


def official_transportation_rule(ctx: _Context) -> CheckResult:
    rule = ctx.query.transportation
    for _, unit in ctx.days:
        if unit["transportation"] and unit["transportation"] != "-":
            value = unit["transportation"]
            # Official quirk: case-sensitive, so "flight ..." or "self-driving ..." pass a ban on them.
            if (rule == "no flight" and "Flight" in value) or (rule == "no self-driving" and "Self-driving" in value):
                return fail(f"The transportation should not be {rule}.")
    return PASS


OFFICIAL_COMMONSENSE = {
    "is_valid_information_in_current_city": official_current_city,
    "is_valid_information_in_sandbox": official_sandbox,
    "is_reasonable_visiting_city": official_reasonable_visiting_city,
    "is_valid_restaurants": official_restaurants,
    "is_valid_attractions": official_attractions,
    "is_valid_transportation": official_transportation,
    "is_valid_accommodation": official_accommodation,
    "is_not_absent": official_not_absent,
}
OFFICIAL_HARD = {
    "valid_cost": official_cost,
    "valid_room_rule": official_room_rule,
    "valid_room_type": official_room_type,
    "valid_cuisine": official_cuisine,
    "valid_transportation": official_transportation_rule,
}


# =================================================================================================================
# strict mode: every quirk fixed
# =================================================================================================================

@dataclass(frozen=True)
class _Day:
    """One day read strictly: its cities, transport and resolved places."""

    number: int
    raw: dict
    cities: list[str] | None
    transport: Transport


def _strict_days(ctx: _Context) -> list[_Day]:
    cached = ctx.cache.get("days")
    if cached is None:
        cached = [_Day(i, unit, current_cities(unit.get("current_city")), parse_transport(unit.get("transportation")))
                  for i, unit in ctx.days]
        ctx.cache["days"] = cached
    return cached


def _text(unit: dict, key: str) -> str | None:
    """A filled text field, or None when absent/empty."""
    value = unit.get(key)
    if is_empty(value):
        return None
    return value if isinstance(value, str) else str(value)


def _resolve(ctx: _Context, kind: str, value: str) -> tuple[list[dict], str | None]:
    """Strict name resolution: ('Name, City') -> the listings of City named exactly Name, or a reason."""
    parsed = split_name_city(value)
    if parsed is None:
        return [], f"{value!r} is not 'Name, City'"
    name, city = parsed
    rows = ctx.lookup.strict(kind, name, city)
    return rows, None if rows else f"no {kind} named {name!r} in {city}"


def _travel_leg(day: _Day) -> tuple[str, str] | None:
    """The day's leg: from the transport text, else from current_city when that is a travel day."""
    transport = day.transport
    if transport.origin and transport.dest:
        return transport.origin, transport.dest
    if day.cities and len(day.cities) == 2:
        return day.cities[0], day.cities[1]
    return None


def strict_not_absent(ctx: _Context) -> CheckResult:
    query = ctx.query
    filled_days = [unit for unit in ctx.plan if unit and unit.get("current_city") != UNFILLED_DAY]
    if len(filled_days) != query.days or len(ctx.plan) < query.days:
        return fail(f"the plan has {len(filled_days)} filled days; the query asks for {query.days}")
    days = _strict_days(ctx)
    for day in days:
        missing = [key for key in PLAN_FIELDS[1:] if key not in day.raw]
        if missing:
            return fail(f"day {day.number} lacks the field(s) {missing}")
        if day.cities is None:
            return fail(f"day {day.number}: current_city {day.raw.get('current_city')!r} is not 'A' or 'from A to B'")
    visited = {city for day in days for city in day.cities} - {query.org}
    if len(visited) != query.visiting_city_number:
        return fail(f"the plan visits {len(visited)} cities {sorted(visited)}; "
                    f"the query asks for {query.visiting_city_number}")
    filled = 0
    for day in days:
        unit, travel = day.raw, len(day.cities) == 2
        if travel and _text(unit, "transportation") is None:
            return fail(f"day {day.number} is a travel day without transportation")
        if not travel and _text(unit, "attraction") is None:
            return fail(f"day {day.number} has no attraction")
        if not travel and any(_text(unit, meal) is None for meal in MEAL_FIELDS):
            return fail(f"day {day.number} misses a meal")
        if day.number != query.days and _text(unit, "accommodation") is None:
            return fail(f"day {day.number} has no accommodation for the night")
        filled += sum(1 for key in ("transportation", *MEAL_FIELDS, "attraction", "accommodation")
                      if _text(unit, key) is not None)
    if filled / (6 * query.days) < 0.5:
        return fail(f"only {filled} of {6 * query.days} fields are filled (less than half)")
    return PASS


def strict_sandbox(ctx: _Context) -> CheckResult:
    for day in _strict_days(ctx):
        unit = day.raw
        reason = _strict_transport_in_sandbox(ctx, day)
        if reason:
            return fail(reason)
        for meal in MEAL_FIELDS:
            value = _text(unit, meal)
            if value is not None:
                rows, why = _resolve(ctx, "restaurant", value)
                if not rows:
                    return fail(f"day {day.number} {meal}: {why}")
        for attraction in split_attractions(_text(unit, "attraction") or "-"):
            rows, why = _resolve(ctx, "attraction", attraction)
            if not rows:
                return fail(f"day {day.number} attraction: {why}")
        value = _text(unit, "accommodation")
        if value is not None:
            rows, why = _resolve(ctx, "accommodation", value)
            if not rows:
                return fail(f"day {day.number} accommodation: {why}")
    return PASS


def _strict_transport_in_sandbox(ctx: _Context, day: _Day) -> str | None:
    """Why the day's transport is not a real flight/route on that day, or None when it is."""
    text = _text(day.raw, "transportation")
    if text is None:
        return None
    transport = day.transport
    if transport.mode == "unknown":
        return f"day {day.number}: transportation {text!r} is not a flight, self-driving or taxi"
    leg = _travel_leg(day)
    if leg is None:
        return f"day {day.number}: transportation {text!r} does not say 'from A to B'"
    if transport.mode == "flight":
        if transport.flight_number is None:
            return f"day {day.number}: the flight has no flight number (F + 7 digits)"
        row = ctx.world.flight(transport.flight_number)
        if row is None:
            return f"day {day.number}: flight {transport.flight_number} does not exist"
        if (row["OriginCityName"], row["DestCityName"]) != leg:
            return (f"day {day.number}: flight {transport.flight_number} flies {row['OriginCityName']} -> "
                    f"{row['DestCityName']}, not {leg[0]} -> {leg[1]}")
        date = ctx.query.date[day.number - 1] if day.number <= len(ctx.query.date) else None
        if row["FlightDate"] != date:
            return f"day {day.number}: flight {transport.flight_number} flies on {row['FlightDate']}, not {date}"
        for given, actual, label in ((transport.departure_time, row["DepTime"], "departure"),
                                     (transport.arrival_time, row["ArrTime"], "arrival")):
            if given is not None and given != str(actual).zfill(5):
                return f"day {day.number}: flight {transport.flight_number} {label} time is {actual}, not {given}"
        return None
    route = ctx.world.distance(*leg)
    if route is None or not route.get("valid"):
        return f"day {day.number}: no valid {transport.mode} route from {leg[0]} to {leg[1]}"
    return None


def strict_current_city(ctx: _Context) -> CheckResult:
    for day in _strict_days(ctx):
        unit, cities = day.raw, day.cities
        if cities is None:
            return fail(f"day {day.number}: current_city {unit.get('current_city')!r} cannot be read")
        text = _text(unit, "transportation")
        if text is not None:
            if len(cities) != 2:
                return fail(f"day {day.number} has transportation {text!r} but stays in {cities[0]}")
            leg = _travel_leg(day)
            if leg != (cities[0], cities[1]):
                return fail(f"day {day.number}: transportation goes {leg}, current_city says {cities[0]} -> "
                            f"{cities[1]}")
        places = [(meal, _text(unit, meal)) for meal in MEAL_FIELDS]
        places += [("attraction", item) for item in split_attractions(_text(unit, "attraction") or "-")]
        for label, value in places:
            if value is None:
                continue
            parsed = split_name_city(value)
            if parsed is None or parsed[1] not in cities:
                return fail(f"day {day.number} {label} {value!r} is not in {' or '.join(cities)}")
        stay = _text(unit, "accommodation")
        if stay is not None:
            parsed = split_name_city(stay)
            if parsed is None or parsed[1] != cities[-1]:
                return fail(f"day {day.number} accommodation {stay!r} is not in {cities[-1]}")
    return PASS


def strict_reasonable_visiting_city(ctx: _Context) -> CheckResult:
    query, sequence = ctx.query, []
    previous_end = None
    for day in _strict_days(ctx):
        if day.cities is None:
            return fail(f"day {day.number}: current_city {day.raw.get('current_city')!r} cannot be read")
        if previous_end is not None and day.cities[0] != previous_end:
            return fail(f"day {day.number} starts in {day.cities[0]} but day {day.number - 1} ended in {previous_end}")
        previous_end = day.cities[-1]
        sequence += day.cities
    if not sequence:
        return fail("the plan has no days")
    if sequence[0] != query.org:
        return fail(f"the trip starts in {sequence[0]}, not at the origin {query.org}")
    if sequence[-1] != query.org:
        return fail(f"the trip ends in {sequence[-1]}, not back at the origin {query.org}")
    if not _is_valid_city_sequence(sequence):
        return fail("a city is visited in more than one block, or for a single stop")
    for position, city in enumerate(sequence):
        state = ctx.world.state_of(city)
        if state is None:
            return fail(f"{city} is not a city of the world")
        inner = 0 < position < len(sequence) - 1
        if inner and query.days > 3 and state != query.dest:
            return fail(f"{city} is not in {query.dest}")
        if inner and query.days <= 3 and city not in (query.dest, query.org):
            return fail(f"{city} is not the destination {query.dest}")
    return PASS


def _place_key(value: str) -> tuple[str, str]:
    parsed = split_name_city(value)
    return (parsed[0].casefold(), parsed[1].casefold()) if parsed else (value.strip().casefold(), "")


@dataclass(frozen=True)
class RepeatedPlace:
    """A restaurant or attraction a plan names again: the day (its 0-based position among `days`), the slot
    (breakfast, lunch, dinner or attraction) and the repeated item as written."""

    position: int
    slot: str
    item: str


def repeated_places(days: list[dict]) -> list[RepeatedPlace]:
    """Every restaurant (over the meals) and every attraction that a plan's `days` name after naming it before, in
    day order; the first naming of a place is not listed. The restaurants and attractions checks fail on the first."""
    out: list[RepeatedPlace] = []
    restaurants: set[tuple[str, str]] = set()
    attractions: set[tuple[str, str]] = set()
    for position, unit in enumerate(days):
        for meal in MEAL_FIELDS:
            value = _text(unit, meal)
            if value is not None:
                key = _place_key(value)
                if key in restaurants:
                    out.append(RepeatedPlace(position, meal, value))
                restaurants.add(key)
        for item in split_attractions(_text(unit, "attraction") or "-"):
            key = _place_key(item)
            if key in attractions:
                out.append(RepeatedPlace(position, "attraction", item))
            attractions.add(key)
    return out


def _first_repeat(ctx: _Context, restaurant: bool) -> RepeatedPlace | None:
    days = [day.raw for day in _strict_days(ctx)]
    return next((r for r in repeated_places(days) if (r.slot != "attraction") == restaurant), None)


def strict_restaurants(ctx: _Context) -> CheckResult:
    repeat = _first_repeat(ctx, restaurant=True)
    if repeat is not None:
        number = _strict_days(ctx)[repeat.position].number
        return fail(f"day {number} {repeat.slot} {repeat.item!r} repeats an earlier restaurant")
    return PASS


def strict_attractions(ctx: _Context) -> CheckResult:
    repeat = _first_repeat(ctx, restaurant=False)
    if repeat is not None:
        number = _strict_days(ctx)[repeat.position].number
        return fail(f"day {number} attraction {repeat.item!r} repeats an earlier one")
    return PASS


def strict_transportation(ctx: _Context) -> CheckResult:
    days = _strict_days(ctx)
    if not days or _text(days[0].raw, "transportation") is None:
        return fail("day 1 has no transportation")
    modes = {day.transport.mode for day in days}
    if "self-driving" in modes and ("flight" in modes or "taxi" in modes):
        return fail("self-driving is combined with " + " and ".join(sorted(modes & {"flight", "taxi"})))
    return PASS


def strict_accommodation(ctx: _Context) -> CheckResult:
    stays = []
    for day in _strict_days(ctx):
        value = _text(day.raw, "accommodation")
        stays.append(split_name_city(value) if value is not None else None)
    for stay, nights in _consecutive(stays):
        if stay is None:
            continue
        rows = ctx.lookup.strict("accommodation", *stay)
        if not rows:
            continue  # an unknown listing fails within-sandbox; there is no minimum to compare with
        required = max(int(row["minimum nights"]) for row in rows)  # ambiguous name: the worst case
        if nights < required:
            return fail(f"{stay[0]}, {stay[1]} needs at least {required} nights; the plan stays {nights}")
    return PASS


def _strict_stay_rows(ctx: _Context) -> list[tuple[int, list[dict]]]:
    out = []
    for day in _strict_days(ctx):
        value = _text(day.raw, "accommodation")
        if value is not None:
            out.append((day.number, _resolve(ctx, "accommodation", value)[0]))
    return out


def strict_cost(ctx: _Context) -> CheckResult:
    people, total = ctx.query.people_number, 0.0
    for day in _strict_days(ctx):
        unit = day.raw
        text = _text(unit, "transportation")
        if text is not None:
            transport, leg = day.transport, _travel_leg(day)
            if transport.mode == "flight":
                total += ctx.world.flight(transport.flight_number)["Price"] * people
            elif transport.mode in ("self-driving", "taxi"):
                km = ctx.world.distance(*leg)["km"]
                total += (int(km * 0.05) * math.ceil(people / 5) if transport.mode == "self-driving"
                          else int(km) * math.ceil(people / 4))
        for meal in MEAL_FIELDS:
            value = _text(unit, meal)
            if value is not None:
                rows, _ = _resolve(ctx, "restaurant", value)
                total += max(float(row["Average Cost"]) for row in rows) * people
        value = _text(unit, "accommodation")
        if value is not None:
            rows, _ = _resolve(ctx, "accommodation", value)
            total += max(float(row["price"]) * math.ceil(people / int(row["maximum occupancy"])) for row in rows)
    ctx.total_cost = total
    if total <= ctx.query.budget:
        return CheckResult("pass", f"total cost {total:g} <= budget {ctx.query.budget}")
    return fail(f"total cost {total:g} exceeds the budget {ctx.query.budget}")


def strict_room_rule(ctx: _Context) -> CheckResult:
    forbidden = f"No {ctx.query.house_rule}"
    for number, rows in _strict_stay_rows(ctx):
        for row in rows:
            if forbidden in str(row["house_rules"] or ""):
                return fail(f"day {number}: {row[_TABLES['accommodation'][1]]} has the rule '{forbidden}'")
    return PASS


def strict_room_type(ctx: _Context) -> CheckResult:
    wanted = ctx.query.room_type
    for number, rows in _strict_stay_rows(ctx):
        for row in rows:
            room = row["room type"]
            ok = room != "Shared room" if wanted == "not shared room" else room == ROOM_TYPE_OF.get(wanted)
            if not ok:
                return fail(f"day {number}: {row['NAME']} is a {room}, the query asks for {wanted}")
    return PASS


def _cuisines(row: dict) -> set[str]:
    value = row.get("Cuisines")
    if not isinstance(value, str):
        return set()
    return {c.strip() for c in value.split(",") if c.strip()}


def strict_cuisine(ctx: _Context) -> CheckResult:
    wanted, served = ctx.query.cuisine or [], set()
    for day in _strict_days(ctx):
        for meal in MEAL_FIELDS:
            value = _text(day.raw, meal)
            parsed = split_name_city(value) if value is not None else None
            if parsed is None or parsed[1] == ctx.query.org:
                continue
            rows = ctx.lookup.strict("restaurant", *parsed)
            if rows:  # an ambiguous name only serves what every candidate serves
                served |= set.intersection(*(_cuisines(row) for row in rows))
    missing = [c for c in wanted if c not in served]
    if missing:
        return fail(f"no meal outside {ctx.query.org} serves {', '.join(missing)}")
    return PASS


def strict_transportation_rule(ctx: _Context) -> CheckResult:
    banned = {"no flight": "flight", "no self-driving": "self-driving"}.get(ctx.query.transportation)
    for day in _strict_days(ctx):
        if day.transport.mode == banned:
            return fail(f"day {day.number} uses {banned}, the query says {ctx.query.transportation}")
    return PASS


STRICT_COMMONSENSE = {
    "is_valid_information_in_current_city": strict_current_city,
    "is_valid_information_in_sandbox": strict_sandbox,
    "is_reasonable_visiting_city": strict_reasonable_visiting_city,
    "is_valid_restaurants": strict_restaurants,
    "is_valid_attractions": strict_attractions,
    "is_valid_transportation": strict_transportation,
    "is_valid_accommodation": strict_accommodation,
    "is_not_absent": strict_not_absent,
}
STRICT_HARD = {
    "valid_cost": strict_cost,
    "valid_room_rule": strict_room_rule,
    "valid_room_type": strict_room_type,
    "valid_cuisine": strict_cuisine,
    "valid_transportation": strict_transportation_rule,
}


def evaluate_both(world: Any, query: Query, plan: Any) -> dict[str, PlanEvaluation]:
    """Both modes of one plan, keyed by mode (the trajectory record's "evaluation" field)."""
    return {mode: evaluate_plan(world, query, plan, mode) for mode in ("strict", "official")}


__all__ = [
    "CheckResult", "PlanEvaluation", "COMMONSENSE_CHECKS", "HARD_CHECKS", "MODES", "evaluate_plan",
    "evaluate_both", "lookup_for",
]
