"""The strict mode's checks (the default, used for rewards): every quirk of the official mode fixed. Every attraction
and every day's city is checked, flights must exist on the day's date and leg, transport modes are detected
case-insensitively and unknown ones fail, names must match a listing exactly and ambiguous names are resolved to the
worst case."""
from __future__ import annotations

import math
from dataclasses import dataclass

from components.travel.checks import (
    LOOKUP_TABLES,
    PASS,
    ROOM_TYPE_OF,
    UNFILLED_DAY,
    CheckResult,
    Context,
    consecutive_runs,
    fail,
    is_valid_city_sequence,
)
from components.travel.plans import (
    MEAL_FIELDS,
    PLAN_FIELDS,
    Transport,
    current_cities,
    is_empty,
    parse_transport,
    split_attractions,
    split_name_city,
)


@dataclass(frozen=True)
class _Day:
    """One day read strictly: its cities, transport and resolved places."""

    number: int
    raw: dict
    cities: list[str] | None
    transport: Transport

def _strict_days(ctx: Context) -> list[_Day]:
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

def _resolve(ctx: Context, kind: str, value: str) -> tuple[list[dict], str | None]:
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

def strict_not_absent(ctx: Context) -> CheckResult:
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

def strict_sandbox(ctx: Context) -> CheckResult:
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

def _strict_transport_in_sandbox(ctx: Context, day: _Day) -> str | None:
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

def strict_current_city(ctx: Context) -> CheckResult:
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

def strict_reasonable_visiting_city(ctx: Context) -> CheckResult:
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
    if not is_valid_city_sequence(sequence):
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

def _first_repeat(ctx: Context, restaurant: bool) -> RepeatedPlace | None:
    days = [day.raw for day in _strict_days(ctx)]
    return next((r for r in repeated_places(days) if (r.slot != "attraction") == restaurant), None)

def strict_restaurants(ctx: Context) -> CheckResult:
    repeat = _first_repeat(ctx, restaurant=True)
    if repeat is not None:
        number = _strict_days(ctx)[repeat.position].number
        return fail(f"day {number} {repeat.slot} {repeat.item!r} repeats an earlier restaurant")
    return PASS

def strict_attractions(ctx: Context) -> CheckResult:
    repeat = _first_repeat(ctx, restaurant=False)
    if repeat is not None:
        number = _strict_days(ctx)[repeat.position].number
        return fail(f"day {number} attraction {repeat.item!r} repeats an earlier one")
    return PASS

def strict_transportation(ctx: Context) -> CheckResult:
    days = _strict_days(ctx)
    if not days or _text(days[0].raw, "transportation") is None:
        return fail("day 1 has no transportation")
    modes = {day.transport.mode for day in days}
    if "self-driving" in modes and ("flight" in modes or "taxi" in modes):
        return fail("self-driving is combined with " + " and ".join(sorted(modes & {"flight", "taxi"})))
    return PASS

def strict_accommodation(ctx: Context) -> CheckResult:
    stays = []
    for day in _strict_days(ctx):
        value = _text(day.raw, "accommodation")
        stays.append(split_name_city(value) if value is not None else None)
    for stay, nights in consecutive_runs(stays):
        if stay is None:
            continue
        rows = ctx.lookup.strict("accommodation", *stay)
        if not rows:
            continue  # an unknown listing fails within-sandbox; there is no minimum to compare with
        required = max(int(row["minimum nights"]) for row in rows)  # ambiguous name: the worst case
        if nights < required:
            return fail(f"{stay[0]}, {stay[1]} needs at least {required} nights; the plan stays {nights}")
    return PASS

def _strict_stay_rows(ctx: Context) -> list[tuple[int, list[dict]]]:
    out = []
    for day in _strict_days(ctx):
        value = _text(day.raw, "accommodation")
        if value is not None:
            out.append((day.number, _resolve(ctx, "accommodation", value)[0]))
    return out

def strict_cost(ctx: Context) -> CheckResult:
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

def strict_room_rule(ctx: Context) -> CheckResult:
    forbidden = f"No {ctx.query.house_rule}"
    for number, rows in _strict_stay_rows(ctx):
        for row in rows:
            if forbidden in str(row["house_rules"] or ""):
                return fail(f"day {number}: {row[LOOKUP_TABLES['accommodation'][1]]} has the rule '{forbidden}'")
    return PASS

def strict_room_type(ctx: Context) -> CheckResult:
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

def strict_cuisine(ctx: Context) -> CheckResult:
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

def strict_transportation_rule(ctx: Context) -> CheckResult:
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
