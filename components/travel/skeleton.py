"""Query skeletons and budgets (query synthesis, steps 1-2), sampled from a world's tables.

A skeleton fixes everything but the text: origin, destination (a city for 3-day trips, a state with at least three
cities other than the origin's for 5/7-day trips), consecutive dates, group size, local constraints by level, and the
budget computed from the candidate pool's lowest/average/highest prices.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import date, timedelta
from statistics import mean
from typing import Any

from components.travel.expert import stay_fits
from components.travel.tasks import HOUSE_RULES, ROOM_TYPES, Query

DAYS_TO_CITIES = {3: 1, 5: 2, 7: 3}
CUISINE_CHOICES = ("Chinese", "American", "Italian", "Mexican", "Indian", "Mediterranean", "French", "Seafood")
NO_CONSTRAINT = {"house rule": None, "cuisine": None, "room type": None, "transportation": None}
# pool multipliers per trip length: (flights, hotel nights, meals)
POOL_MULTIPLIERS = {3: (2, 3, 9), 5: (3, 5, 15), 7: (4, 7, 21)}
LEVEL_BUDGET_FACTOR = {"easy": 1.0, "medium": 0.75, "hard": 0.5}


@dataclass(frozen=True)
class CityPool:
    """The cities a split may use (training cities, or only held-out states' cities for validation)."""

    cities: tuple[str, ...]
    state_of: dict[str, str]

    def states_for_multi_city(self, org: str, visiting: int) -> list[str]:
        """States other than the origin's with at least max(3, visiting) pool cities."""
        by_state: dict[str, list[str]] = {}
        for city in self.cities:
            by_state.setdefault(self.state_of[city], []).append(city)
        home = self.state_of.get(org)
        return sorted(s for s, cs in by_state.items() if s != home and len(cs) >= max(3, visiting))

    def cities_in(self, state: str) -> list[str]:
        return [c for c in self.cities if self.state_of[c] == state]


def city_pool(world: Any, holdout: bool) -> CityPool:
    """Training pool (cities outside `world.holdout_states`) or validation pool (only held-out states' cities)."""
    held = set(getattr(world, "holdout_states", ()) or ())
    cities = [c for c in world.cities if (world.state_of(c) in held) == holdout] if held else list(world.cities)
    return CityPool(tuple(cities), {c: world.state_of(c) for c in cities})


def consecutive_dates(start: str, days: int) -> tuple[str, ...]:
    first = date.fromisoformat(start)
    return tuple((first + timedelta(days=k)).isoformat() for k in range(days))


def sample_dates(world_dates: list[str], days: int, rng: random.Random) -> tuple[str, ...] | None:
    """Consecutive dates that all lie within the world's flight calendar; None when the calendar is too short."""
    calendar = set(world_dates)
    starts = [d for d in world_dates if all(x in calendar for x in consecutive_dates(d, days))]
    return consecutive_dates(rng.choice(starts), days) if starts else None


def sample_constraints(level: str, rng: random.Random) -> dict:
    """Local constraints by level: easy none; medium exactly one of house rule, cuisine (2), room type; hard a
    transportation rule plus two of house rule, cuisine (2-3), room type."""
    constraint = dict(NO_CONSTRAINT)
    if level == "easy":
        return constraint
    kinds = ["house rule", "cuisine", "room type"]
    chosen = rng.sample(kinds, 1 if level == "medium" else 2)
    for kind in chosen:
        if kind == "house rule":
            constraint[kind] = rng.choice(HOUSE_RULES)
        elif kind == "room type":
            constraint[kind] = rng.choice(ROOM_TYPES)
        else:
            constraint[kind] = rng.sample(CUISINE_CHOICES, 2 if level == "medium" else rng.choice([2, 3]))
    if level == "hard":
        constraint["transportation"] = rng.choice(["no flight", "no self-driving"])
    return constraint


def people_for(level: str, rng: random.Random) -> int:
    return 1 if level == "easy" else rng.randint(2, 8)


def sample_skeleton(world: Any, pool: CityPool, level: str, rng: random.Random, days_choices: tuple[int, ...],
                    drive_only: bool = False, same_state_fraction: float | None = None) -> dict | None:
    """One skeleton (every official field but budget and text), or None when this draw has no valid destination.

    `drive_only` restricts the destination to cities reachable by road but by no flight on the first day.
    `same_state_fraction` (one-city trips): the chance that the destination is drawn from the origin's own state,
    else from the other states (None: from every other city of the pool, drawing nothing more from `rng`).
    """
    org = rng.choice(pool.cities)
    days = rng.choice(days_choices)
    visiting = DAYS_TO_CITIES[days]
    dates = sample_dates(world.dates, days, rng)
    if dates is None:
        return None
    if visiting == 1:
        candidates = [c for c in pool.cities if c != org]
        if same_state_fraction is not None:
            same = rng.random() < same_state_fraction
            candidates = [c for c in candidates if (pool.state_of[c] == pool.state_of[org]) == same]
        if drive_only:
            candidates = [c for c in candidates if _drive_only(world, org, c, dates[0])]
        if not candidates:
            return None
        dest = rng.choice(candidates)
    else:
        states = pool.states_for_multi_city(org, visiting)
        if drive_only:
            states = [s for s in states if any(_drive_only(world, org, c, dates[0]) for c in pool.cities_in(s))]
        if not states:
            return None
        dest = rng.choice(states)
    return {
        "org": org, "dest": dest, "days": days, "visiting_city_number": visiting, "date": list(dates),
        "people_number": people_for(level, rng), "local_constraint": sample_constraints(level, rng),
        "level": level,
    }


def _drive_only(world: Any, origin: str, destination: str, day: str) -> bool:
    route = world.distance(origin, destination)
    return bool(route and route["valid"]) and not world.flights_on(origin, destination, day)


def destination_cities(world: Any, skeleton: dict) -> list[str]:
    """The cities a skeleton's trip may visit: the destination city, or the destination state's cities."""
    if skeleton["visiting_city_number"] == 1:
        return [skeleton["dest"]]
    return [c for c in world.cities_in(skeleton["dest"]) if c != skeleton["org"]]


def price_pool(world: Any, skeleton: dict) -> dict[str, list[float]]:
    """Candidate prices: flights (per person) between the origin and the destination cities on the trip's dates
    (self-driving costs when no flight flies), stays (per night, fitting the constraints when any do), meals."""
    cities = destination_cities(world, skeleton)
    query = Query.from_dict({**skeleton, "idx": 0, "budget": 1})
    dates = skeleton["date"]
    flights = [float(f["Price"]) for c in cities
               for a, b, d in ((skeleton["org"], c, dates[0]), (c, skeleton["org"], dates[-1]))
               for f in world.flights_on(a, b, d)]
    if not flights:
        flights = [float(int(r["km"] * 0.05)) for c in cities
                   for r in (world.distance(skeleton["org"], c), world.distance(c, skeleton["org"])) if r and r["valid"]]
    stays_all = [r for c in cities for r in world.accommodations_in(c)]
    stays = [r for r in stays_all if stay_fits(r, query)] or stays_all
    meals = [float(r["Average Cost"]) for c in cities for r in world.restaurants_in(c)]
    return {"flights": flights or [0.0], "stays": [float(r["price"]) for r in stays] or [0.0],
            "meals": meals or [0.0]}


def budget_for(skeleton: dict, pool: dict[str, list[float]]) -> int:
    """The Agent-STAR budget rule: low/avg/high pool totals with per-length multipliers, (avg+low)/2 for 3 days,
    avg for 5, (avg+high)/2 for 7; medium x people x 0.75, hard x people x 0.5; rounded to hundreds."""
    n_flights, n_nights, n_meals = POOL_MULTIPLIERS[skeleton["days"]]

    def total(pick) -> float:
        return (pick(pool["flights"]) * n_flights + pick(pool["stays"]) * n_nights + pick(pool["meals"]) * n_meals)

    low, avg, high = total(min), total(mean), total(max)
    base = {3: (avg + low) / 2, 5: avg, 7: (avg + high) / 2}[skeleton["days"]]
    level = skeleton["level"]
    if level != "easy":
        base *= skeleton["people_number"] * LEVEL_BUDGET_FACTOR[level]
    return max(100, int(math.floor(base / 100 + 0.5)) * 100)
