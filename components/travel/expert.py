"""The programmatic expert: solves a query through tool calls only, with global backtracking, budget awareness,
short restating `<think>` reasoning, seeded search orders and a configurable mistake rate.

The expert is a generator (`solve`) that yields `Action`s (a tool call, or the final answer) and receives each
call's observation text back; it reads observations with `tools.parse_observation`, never the world. Two drivers
run it: `ExpertPolicy` (the `Policy` interface, through the real environment and the agent loop) and
`solve_with_tools` (direct tool calls; the query synthesiser proves feasibility with it).

Itinerary layout for k visited cities over 2k+1 days (k = 1, 2, 3): day 1 travels origin -> c1, day 2 is a full day
in c1, day 3 travels c1 -> c2, ..., the last day travels c_k -> origin; two nights per city. Full days get three
meals and an attraction; travel days get optional meals/attractions when the city has spare ones.
"""
from __future__ import annotations

import itertools
import json
import math
import random
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Generator

from components.agent.environment import is_turn_error
from components.agent.types import TurnPolicy, TurnRequest, TurnResult
from components.travel.checks import ROOM_TYPE_OF
from components.travel.tasks import Query
from components.syllables import NAME_SYLLABLES
from components.travel.tools import call_tool, parse_observation

MISTAKES = ("wrong_city_restaurant", "repeat_restaurant", "skip_constraint", "over_budget")
NIGHTS_PER_CITY = 2
TRANSIENT_MARKER = "temporarily unavailable"
MAX_RETRIES = 5  # transient tool failures retried per call
CITY_ARGUMENTS = ("departure", "destination", "city")
# The think after a slipped call: it names the slip and the exact name (SLIP_PATTERN reads it back).
SLIP_NOTE = "'{wrong}' is not a city; the exact name is {right}."
SLIP_PATTERN = re.compile(r"'([^'\n]+)' is not a city; the exact name is ([^.\n]+)\.")


@dataclass(frozen=True)
class ExpertConfig:
    """How the expert searches: `mistake_rate` is the probability of one deliberate mistake per episode;
    `max_routes` caps the city sequences tried for multi-city trips; `shortlist` is how many of the cheapest valid
    options a non-frugal pick chooses from (variety); `seed` seeds search orders and picks; `max_tool_calls` stops
    the search in time to answer within the episode's turn limit; `slip_rate` is the probability that a call with a
    city argument is first made with a slipped name (`slip_name`), so the trajectory shows the recovery: the
    environment's unknown-city error, then a think naming the exact city and the corrected call. The filter never
    trains the slipped turn itself (`trained_turn`, components/agent/environment.py), only the recovery."""

    mistake_rate: float = 0.0
    max_routes: int = 30
    shortlist: int = 3
    seed: int = 0
    max_tool_calls: int = 55  # give up (and say so) before an episode's turn limit
    slip_rate: float = 0.0


@dataclass
class Action:
    """One expert turn: a tool call (`name`, `arguments`) or the final `plan`, with the reasoning before it."""

    think: str
    name: str | None = None
    arguments: dict | None = None
    plan: list[dict] | None = None

    def text(self) -> str:
        """The assistant turn in the exact protocol."""
        if self.plan is not None:
            return f"<think>{self.think}</think><answer>{json.dumps(self.plan, ensure_ascii=False)}</answer>"
        call = json.dumps({"name": self.name, "arguments": self.arguments}, ensure_ascii=False)
        return f"<think>{self.think}</think><tool_call>{call}</tool_call>"


@dataclass
class Failure(Exception):
    """Why a route or mode did not work: `kind` is city|leg|cuisine|budget|fill, with the culprit city if any."""

    kind: str
    reason: str
    city: str | None = None
    known: bool = False  # already explained in an earlier turn: no new reasoning needed


@dataclass
class CityOptions:
    """What one visited city offers, read from the observations."""

    city: str
    stays: list[dict]
    restaurants: list[dict]
    attractions: list[dict]


@dataclass
class Leg:
    """One chosen transport leg: its plan string and its cost for the whole group."""

    origin: str
    destination: str
    mode: str
    text: str
    cost: float
    cheapest: "Leg | None" = None  # the cheapest alternative seen (frugal plans use it)


@dataclass
class Outcome:
    """The result of `solve`: the plan (None when no plan fits), its estimated cost, and why it failed."""

    plan: list[dict] | None
    cost: float | None = None
    reason: str | None = None
    tool_calls: int = 0
    mistake: str | None = None
    failure_kind: str | None = None


# ---- small pure helpers ----------------------------------------------------------------------------------------

def stay_fits(row: dict, query: Query, nights: int = NIGHTS_PER_CITY) -> bool:
    """A listing satisfies the query's room type and house rule and can be booked for `nights` nights."""
    wanted = query.room_type
    room = row.get("room type")
    if wanted == "not shared room" and room == "Shared room":
        return False
    if wanted in ROOM_TYPE_OF and room != ROOM_TYPE_OF[wanted]:
        return False
    if query.house_rule and f"No {query.house_rule}" in str(row.get("house_rules") or ""):
        return False
    minimum = row.get("minimum nights")
    return minimum is None or (isinstance(minimum, float) and math.isnan(minimum)) or minimum <= nights


def rooms_needed(row: dict, people: int) -> int:
    """Units of a listing a group books: ceil(people / maximum occupancy)."""
    return math.ceil(people / max(1, int(row.get("maximum occupancy") or 1)))


def stay_cost(row: dict, people: int, nights: int = NIGHTS_PER_CITY) -> float:
    return float(row["price"]) * rooms_needed(row, people) * nights


def cuisines_of(row: dict) -> set[str]:
    return {c.strip() for c in str(row.get("Cuisines") or "").split(",") if c.strip()}


def leg_cost(mode: str, price: float, people: int) -> float:
    """Group cost of one leg: flights per person, self-driving per 5 people, taxi per 4."""
    if mode == "flight":
        return price * people
    return price * math.ceil(people / (5 if mode == "self-driving" else 4))


def trip_modes(query: Query, rng: random.Random) -> list[str]:
    """Trip-level transport plans to try, in a seeded order: 'flight' (flights, taxi where no flight flies),
    'self-driving' (never mixed with flights or taxis) and 'taxi'."""
    if query.transportation == "no flight":
        modes = ["self-driving", "taxi"]
    elif query.transportation == "no self-driving":
        return ["flight", "taxi"]
    else:
        modes = ["flight", "self-driving"]
    rng.shuffle(modes)
    return modes


def day_layout(org: str, route: list[str]) -> list[dict]:
    """The skeleton of each day: travel leg (or None), the city slept in, the city of a full day."""
    days: list[dict] = []
    previous = org
    for city in route:
        days.append({"leg": (previous, city), "sleep": city, "full": None})
        days.append({"leg": None, "sleep": city, "full": city})
        previous = city
    days.append({"leg": (previous, org), "sleep": None, "full": None})
    return days


def flight_leg(origin: str, destination: str, flight: dict, people: int) -> Leg:
    """A flight leg from a SearchFlight row."""
    text = (f"Flight Number: {flight['Flight Number']}, from {origin} to {destination}, "
            f"Departure Time: {flight['DepTime']}, Arrival Time: {flight['ArrTime']}")
    return Leg(origin, destination, "flight", text, leg_cost("flight", flight["Price"], people))


def money(value: float) -> str:
    return f"${value:g}"


FLIGHT_NUMBER = re.compile(r"Flight Number: ([^,]+),")  # a flight leg's number in a plan (`flight_leg`'s text)


def swaps(picked: list[dict], cheapest: list[dict]) -> list[str]:
    """What the budget repair changes, in day order, as the think states it: each flight and each stay of
    `picked` that the plan `cheapest` (the same days with the cheapest options) replaces."""
    out: list[str] = []
    for before, after in zip(picked, cheapest):
        old, new = FLIGHT_NUMBER.match(before["transportation"]), FLIGHT_NUMBER.match(after["transportation"])
        if old and new and old.group(1) != new.group(1):
            out.append(f"I take {new.group(1)} instead of {old.group(1)}")
        if after["accommodation"] != before["accommodation"] and after["accommodation"] != "-":
            name, _, city = after["accommodation"].rpartition(", ")
            stay = f"I stay at {name} in {city} instead of {before['accommodation'].rpartition(', ')[0]}"
            if stay not in out:
                out.append(stay)
    return out


def join_notes(notes: list[str]) -> str:
    """One think from its notes, joined by spaces."""
    return " ".join(note for note in notes if note).strip()


# ---- the expert ----------------------------------------------------------------------------------------------

class Expert:
    """One episode's solver. `solve()` is the generator; state (tool results cached, notes for the next think) lives
    on the instance."""

    def __init__(self, query: Query, config: ExpertConfig = ExpertConfig(), seed: int | None = None):
        self.query = query
        self.config = config
        self.rng = random.Random(config.seed if seed is None else seed)
        self.mistake = self.rng.choice(MISTAKES) if self.rng.random() < config.mistake_rate else None
        self.cache: dict[tuple[str, str], list[dict]] = {}
        self.notes: list[str] = []
        self.tool_calls = 0
        self.failed: dict[tuple, Failure] = {}  # leg or city -> why it failed (backtracking never retries it)
        self.solved: dict[tuple, Any] = {}  # leg or city -> its chosen options (reused by later routes)

    # -- tool access -------------------------------------------------------------------------------------------
    def call(self, name: str, intent: str, **arguments: str) -> Generator[Action, str, list[dict]]:
        """Call a tool (once per distinct call; repeated on transient failures) and return its parsed rows."""
        key = (name, json.dumps(arguments, sort_keys=True))
        if key in self.cache:
            return self.cache[key]
        yield from self.maybe_slip(name, intent, arguments)
        rows: list[dict] = []
        for _ in range(MAX_RETRIES + 1):
            if self.tool_calls >= self.config.max_tool_calls:
                raise Failure("search", f"I have used my budget of {self.tool_calls} tool calls")
            think = join_notes([*self.notes, intent])
            self.notes = []
            observation = yield Action(think=think, name=name, arguments=dict(arguments))
            self.tool_calls += 1
            rows = parse_observation(name, observation or "")
            if rows or TRANSIENT_MARKER not in (observation or ""):
                break
            self.notes.append(f"{name} failed transiently; retrying.")
        self.cache[key] = rows
        return rows

    def maybe_slip(self, name: str, intent: str, arguments: dict) -> Generator[Action, str, None]:
        """With probability `slip_rate`, first make the call with one city argument slipped; after the error, the
        next think starts with SLIP_NOTE. A slipped name the environment accepts (another real city) is noted too."""
        cities = [a for a in CITY_ARGUMENTS if a in arguments]
        if not cities or self.config.slip_rate <= 0 or self.rng.random() >= self.config.slip_rate:
            return
        if self.tool_calls + 2 >= self.config.max_tool_calls:
            return
        argument = self.rng.choice(cities)
        right = arguments[argument]
        wrong = slip_name(right)
        if wrong == right:
            return
        think = join_notes([*self.notes, intent.replace(right, wrong)])
        self.notes = []
        observation = yield Action(think=think, name=name, arguments={**arguments, argument: wrong})
        self.tool_calls += 1
        if is_turn_error(observation or ""):
            self.notes.append(SLIP_NOTE.format(wrong=wrong, right=right))
        else:
            self.notes.append(f"That was {wrong}; I meant {right}.")

    def pick(self, options: list[Any], price: Callable[[Any], float], frugal: bool) -> Any:
        """The cheapest option when frugal, else a seeded pick among the `shortlist` cheapest."""
        ranked = sorted(options, key=price)
        if frugal or self.config.shortlist <= 1:
            return ranked[0]
        return self.rng.choice(ranked[: self.config.shortlist])

    # -- the search ----------------------------------------------------------------------------------------------
    def routes(self) -> Generator[Action, str, list[list[str]]]:
        """Candidate city sequences: the destination city, or ordered picks of the destination state's cities."""
        q = self.query
        if q.visiting_city_number <= 1 and q.days <= 3:
            return [[q.dest]]
        rows = yield from self.call("SearchCity", f"First I list the cities of {q.dest}.", state=q.dest)
        cities = [r["City"] for r in rows if r["City"] != q.org]
        if len(cities) < q.visiting_city_number:
            self.notes.append(f"{q.dest} has only {len(cities)} cities to visit.")
            return []
        routes = list(itertools.permutations(cities, q.visiting_city_number))
        self.rng.shuffle(routes)
        self.notes.append(f"{q.dest} has {', '.join(cities)}.")
        return [list(r) for r in routes]

    def city_options(self, city: str) -> Generator[Action, str, CityOptions]:
        """Stays, restaurants and attractions of a visited city; raises Failure(kind='city') when it cannot host."""
        q = self.query
        stays_all = yield from self.call("SearchAccommodation", f"Now I look for a place to stay in {city}.", city=city)
        stays = [r for r in stays_all if stay_fits(r, q)]
        if not stays:
            raise Failure("city", f"no listing in {city} fits ({len(stays_all)} listed; room type, house rules "
                                  f"or minimum nights rule them out)", city)
        choice = self.pick(stays, lambda r: stay_cost(r, q.people_number), frugal=False)
        self.notes.append(
            f"{len(stays)} of {len(stays_all)} listings in {city} fit; I pick {choice['NAME']} "
            f"({money(choice['price'])}/night, {choice['room type']}, {rooms_needed(choice, q.people_number)} unit(s)).")
        listed = yield from self.call("SearchRestaurant", f"Next, restaurants in {city}.", city=city)
        restaurants = [{**r, "City": city} for r in listed]
        if len(restaurants) < 3:
            raise Failure("city", f"{city} has {len(restaurants)} restaurants; a full day needs 3", city)
        cheapest = sorted(restaurants, key=lambda r: r["Average Cost"])[:3]
        self.notes.append(
            f"{len(restaurants)} restaurants in {city}; good value: "
            + ", ".join(f"{r['Name']} ({money(r['Average Cost'])})" for r in cheapest) + ".")
        listed = yield from self.call("SearchAttraction", f"Then attractions in {city}.", city=city)
        attractions = [{**r, "City": city} for r in listed]
        if not attractions:
            raise Failure("city", f"{city} has no attraction for its full day", city)
        self.notes.append(f"{len(attractions)} attractions in {city}, e.g. {attractions[0]['Name']}.")
        options = CityOptions(city, stays, restaurants, attractions)
        options.stays.sort(key=lambda r: r["NAME"] != choice["NAME"])  # the announced pick first
        return options

    def leg(self, origin: str, destination: str, date: str, mode: str) -> Generator[Action, str, Leg]:
        """The transport of one leg under a trip mode; raises Failure(kind='leg') when there is none."""
        people = self.query.people_number
        if mode == "flight":
            flights = yield from self.call("SearchFlight", f"I check flights {origin} -> {destination} on {date}.",
                                           departure=origin, destination=destination, date=date)
            if flights:
                f = self.pick(flights, lambda r: r["Price"], frugal=False)
                self.notes.append(f"{len(flights)} flights; I take {f['Flight Number']} ({money(f['Price'])}/person, "
                                  f"{f['DepTime']}-{f['ArrTime']}).")
                chosen = flight_leg(origin, destination, f, people)
                chosen.cheapest = flight_leg(origin, destination, min(flights, key=lambda r: r["Price"]), people)
                return chosen
            self.notes.append(f"No flight {origin} -> {destination} on {date}.")
            mode = "taxi"
        tool_mode = "driving" if mode == "self-driving" else "taxi"
        rows = yield from self.call("GoogleDistanceMatrix", f"I check a {mode} route {origin} -> {destination}.",
                                    departure=origin, destination=destination, mode=tool_mode)
        if not rows:
            raise Failure("leg", f"no {mode} route from {origin} to {destination}")
        r = rows[0]
        label = "Self-driving" if mode == "self-driving" else "Taxi"
        cost = leg_cost(mode, r["cost"], people)
        self.notes.append(f"{label} {origin} -> {destination}: {r['duration']}, {r['distance']}, {money(r['cost'])}.")
        text = (f"{label}, from {origin} to {destination}, duration: {r['duration']}, distance: {r['distance']}, "
                f"cost: {r['cost']}")
        return Leg(origin, destination, mode, text, cost)

    def solve(self) -> Generator[Action, str, Outcome]:
        """Search routes x modes until a plan within budget is found; yields tool calls, then the answer."""
        q = self.query
        routes = yield from self.routes()
        bad_cities: set[str] = set()
        reason = "no candidate route" if not routes else None
        kind = "route" if not routes else None
        tried = 0
        for route in routes:
            if tried >= self.config.max_routes or kind == "search":
                reason, kind = reason or "no route left to try", kind or "route"
                break
            if bad_cities & set(route):
                continue
            calls_before = self.tool_calls
            for mode in trip_modes(q, self.rng):
                try:
                    plan, cost, story = yield from self.try_route(route, mode)
                except Failure as failure:
                    reason, kind = failure.reason, failure.kind
                    if not failure.known:
                        follow_up = {"city": "; I change the city.", "cuisine": "; I change the city.",
                                     "search": "."}.get(failure.kind, "; I change the plan.")
                        self.notes.append(f"{failure.reason[0].upper()}{failure.reason[1:]}{follow_up}")
                    if failure.city:
                        bad_cities.add(failure.city)
                    if failure.kind in ("city", "cuisine", "fill", "search"):
                        break
                    continue
                finally:
                    tried += int(self.tool_calls > calls_before)
                    calls_before = self.tool_calls
                if self.mistake:
                    plan = self.apply_mistake(plan, route)
                think = join_notes([*self.notes, story])
                self.notes = []
                yield Action(think=think, plan=plan)
                return Outcome(plan, cost, None, self.tool_calls, self.mistake)
        think = join_notes([*self.notes, f"I found no plan within the budget of {money(q.budget)}."])
        self.notes = []
        yield Action(think=think, plan=[])
        return Outcome(None, None, reason or "no plan within budget", self.tool_calls, self.mistake, kind or "budget")

    def remembering(self, key: tuple, step: Generator[Action, str, Any]) -> Generator[Action, str, Any]:
        """Run a search step once: a later route reuses its result (or its failure) without new calls or notes."""
        if key in self.failed:
            known = self.failed[key]
            raise Failure(known.kind, known.reason, known.city, known=True)
        if key in self.solved:
            return self.solved[key]
        try:
            self.solved[key] = yield from step
        except Failure as failure:
            self.failed[key] = failure
            raise
        return self.solved[key]

    def try_route(self, route: list[str], mode: str) -> Generator[Action, str, tuple[list[dict], float, str]]:
        """Walk the itinerary (leg, city, leg, ...), then assemble; try the cheapest options if over budget."""
        q = self.query
        layout = day_layout(q.org, route)
        legs: list[Leg] = []
        cities: dict[str, CityOptions] = {}
        for number, day in enumerate(layout):
            if day["leg"]:
                key = (*day["leg"], q.date[number] if mode == "flight" else None, mode)
                legs.append((yield from self.remembering(key,
                                                         self.leg(*day["leg"], q.date[number], mode))))
            if day["full"]:
                cities[day["full"]] = yield from self.remembering((day["full"],), self.city_options(day["full"]))
        if self.mistake == "over_budget":
            plan, cost = self.assemble(layout, legs, cities, frugal=False, lavish=True)
            return plan, cost, f"Plan ready; total {money(cost)}."
        plan, cost = self.assemble(layout, legs, cities, frugal=False)
        if cost <= q.budget:
            return plan, cost, f"Total {money(cost)} is within the budget of {money(q.budget)}."
        plan_frugal, cost_frugal = self.assemble(layout, legs, cities, frugal=True)
        if cost_frugal <= q.budget:
            # The thinks named the first picks; the answer's think names each one the cheaper plan replaces.
            changes = swaps(plan, plan_frugal)
            changes = ": " + "; ".join(changes) if changes else ""
            return plan_frugal, cost_frugal, (f"My picks cost {money(cost)} > budget {money(q.budget)}; with the "
                                              f"cheapest options the total is {money(cost_frugal)}{changes}.")
        raise Failure("budget", f"even the cheapest {mode} plan via {' -> '.join(route)} costs {money(cost_frugal)}, "
                                f"over the budget of {money(q.budget)}")

    # -- assembling the plan -------------------------------------------------------------------------------------
    def assemble(self, layout: list[dict], legs: list[Leg], cities: dict[str, CityOptions], frugal: bool,
                 lavish: bool = False) -> tuple[list[dict], float]:
        """Build the day dicts and their cost; raises Failure for cuisines that cannot be covered."""
        q = self.query
        people = q.people_number
        stay = {c: (max(o.stays, key=lambda r: float(r["price"])) if lavish
                    else o.stays[0] if not frugal else min(o.stays, key=lambda r: stay_cost(r, people)))
                for c, o in cities.items()}
        meals = self.assign_restaurants(layout, cities, frugal)
        sights = self.assign_attractions(layout, cities)
        plan, cost, leg_iter = [], 0.0, iter(legs)
        for number, day in enumerate(layout, start=1):
            unit = {"days": number, "current_city": day["full"] or f"from {day['leg'][0]} to {day['leg'][1]}",
                    "transportation": "-", "breakfast": "-", "attraction": "-", "lunch": "-", "dinner": "-",
                    "accommodation": "-"}
            if day["leg"]:
                leg = next(leg_iter)
                leg = (leg.cheapest or leg) if frugal else leg
                unit["transportation"] = leg.text
                cost += leg.cost
            for meal, row in meals.get(number, {}).items():
                unit[meal] = f"{row['Name']}, {row['City']}"
                cost += float(row["Average Cost"]) * people
            if sights.get(number):
                unit["attraction"] = f"{sights[number]['Name']}, {sights[number]['City']};"
            if day["sleep"]:
                row = stay[day["sleep"]]
                unit["accommodation"] = f"{row['NAME']}, {day['sleep']}"
                cost += float(row["price"]) * rooms_needed(row, people)
            plan.append(unit)
        if filled_fraction(plan) < 0.5:
            raise Failure("fill", "the plan would leave more than half of its fields empty")
        return plan, cost

    def meal_slots(self, layout: list[dict], cities: dict[str, CityOptions]) -> list[tuple[int, str, str, bool]]:
        """(day, meal, city, required) for every meal a plan may fill: full days' three meals (required), the
        arrival day's dinner and the departure day's breakfast in a visited city (optional)."""
        slots = []
        for number, day in enumerate(layout, start=1):
            if day["full"]:
                slots += [(number, meal, day["full"], True) for meal in ("breakfast", "lunch", "dinner")]
            elif day["leg"]:
                origin, destination = day["leg"]
                if origin in cities:
                    slots.append((number, "breakfast", origin, False))
                if destination in cities:
                    slots.append((number, "dinner", destination, False))
        return slots

    def assign_restaurants(self, layout: list[dict], cities: dict[str, CityOptions],
                           frugal: bool) -> dict[int, dict[str, dict]]:
        """Distinct restaurants: the required cuisines first (in any meal slot), then the full days' meals, then,
        unless frugal, spare restaurants on travel days."""
        wanted = list(self.query.cuisine or [])
        slots = self.meal_slots(layout, cities)
        used: set[str] = set()
        out: dict[int, dict[str, dict]] = {}

        def free_in(city: str) -> list[dict]:
            return [r for r in cities[city].restaurants if r["Name"] not in used]

        def place(slot: tuple[int, str, str, bool], row: dict) -> None:
            out.setdefault(slot[0], {})[slot[1]] = row
            used.add(row["Name"])
            slots.remove(slot)

        for cuisine in wanted:
            if any(cuisine in cuisines_of(r) for meals in out.values() for r in meals.values()):
                continue
            candidates = [(slot, r) for slot in sorted(slots, key=lambda s: not s[3])
                          for r in free_in(slot[2]) if cuisine in cuisines_of(r)]
            if not candidates:
                raise Failure("cuisine", f"no free meal on this route serves {cuisine}")
            slot = candidates[0][0]
            place(slot, self.pick([r for s, r in candidates if s == slot], lambda r: r["Average Cost"], frugal))
        for slot in [s for s in slots if s[3]]:
            free = free_in(slot[2])
            if not free:
                raise Failure("city", f"{slot[2]} has too few distinct restaurants", slot[2])
            place(slot, self.pick(free, lambda r: r["Average Cost"], frugal))
        if not frugal:
            for slot in list(slots):
                free = free_in(slot[2])
                if free:
                    place(slot, self.pick(free, lambda r: r["Average Cost"], frugal))
        return out

    def assign_attractions(self, layout: list[dict], cities: dict[str, CityOptions]) -> dict[int, dict]:
        """One attraction per full day, and one on the arrival day when the city has a spare one (a seeded shuffle,
        full days first)."""
        out: dict[int, dict] = {}
        order = {c: self.rng.sample(o.attractions, len(o.attractions)) for c, o in cities.items()}
        for number, day in enumerate(layout, start=1):
            if day["full"]:
                out[number] = order[day["full"]].pop(0)
        for number, day in enumerate(layout, start=1):
            if day["leg"] and day["sleep"] and order.get(day["sleep"]):
                out[number] = order[day["sleep"]].pop(0)
        return out

    # -- deliberate mistakes ---------------------------------------------------------------------------------------
    def apply_mistake(self, plan: list[dict], route: list[str]) -> list[dict]:
        """Corrupt one aspect of a correct plan (for the mistake-rate knob)."""
        plan = [dict(day) for day in plan]
        full_days = [d for d in plan if "from " not in d["current_city"]]
        day = self.rng.choice(full_days)
        if self.mistake == "repeat_restaurant":
            day["lunch"] = day["breakfast"]
        elif self.mistake == "skip_constraint" and self._violating_stay(plan):
            pass
        elif self.mistake in ("wrong_city_restaurant", "skip_constraint"):
            name = day["dinner"].rsplit(",", 1)[0]
            others = [c for c in [self.query.org, *route] if c != day["current_city"]]
            day["dinner"] = f"{name}, {self.rng.choice(others)}"
        return plan

    def _violating_stay(self, plan: list[dict]) -> bool:
        """Swap one stay for a listing the query's constraints rule out; False when every listing fits."""
        for day in plan:
            if day["accommodation"] == "-":
                continue
            city = day["accommodation"].rsplit(", ", 1)[1]
            rows = self.cache.get(("SearchAccommodation", json.dumps({"city": city}, sort_keys=True)), [])
            bad = [r for r in rows if not stay_fits(r, self.query)]
            if bad:
                name = self.rng.choice(bad)["NAME"]
                for other in plan:
                    if other["accommodation"].endswith(f", {city}"):
                        other["accommodation"] = f"{name}, {city}"
                return True
        return False


def syllables(name: str) -> list[str] | None:
    """The coined syllables of `name` (longest first at each position), or None when it is not made of them."""
    word, pieces = name.lower(), []
    ordered = sorted(NAME_SYLLABLES, key=len, reverse=True)
    while word:
        piece = next((p for p in ordered if word.startswith(p)), None)
        if piece is None:
            return None
        pieces.append(piece)
        word = word[len(piece):]
    return pieces


def slip_name(name: str) -> str:
    """The name as a small model tends to miswrite it (measured on the tiny SFT model's validation episodes: "Pala"
    for Palavi, "Helca" for Helcano): a coined name loses its last syllable, any other name its last third."""
    pieces = syllables(name) if " " not in name else None
    if pieces and len(pieces) >= 2:
        return name[: len(name) - len(pieces[-1])]
    return name[: max(1, min(len(name) - 1, math.ceil(len(name) * 2 / 3)))]


def filled_fraction(plan: list[dict]) -> float:
    """Share of the six per-day fields that hold a value (the complete-information rule needs at least half)."""
    keys = ("transportation", "breakfast", "lunch", "dinner", "attraction", "accommodation")
    filled = sum(1 for day in plan for key in keys if day.get(key) not in (None, "", "-"))
    return filled / (6 * max(1, len(plan)))


# ---- drivers ----------------------------------------------------------------------------------------------------

def strip_tool_response(content: str) -> str:
    """The observation inside a `<tool_response>` user message (the text itself when unwrapped)."""
    text = content.strip()
    if text.startswith("<tool_response>") and text.endswith("</tool_response>"):
        text = text[len("<tool_response>"): -len("</tool_response>")]
    return text.strip("\n")


def solve_with_tools(world: Any, query: Query, config: ExpertConfig = ExpertConfig(),
                     seed: int | None = None) -> tuple[Outcome, list[Action]]:
    """Run the expert with direct tool calls (no chat protocol): the solver the query synthesiser uses."""
    expert = Expert(query, config, seed)
    actions: list[Action] = []
    generator = expert.solve()
    try:
        action = next(generator)
        while True:
            actions.append(action)
            observation = call_tool(world, action.name, action.arguments).text if action.plan is None else ""
            action = generator.send(observation)
    except StopIteration as stop:
        return stop.value, actions


def query_of(meta: dict) -> Query:
    """The structured query from `TurnRequest.meta["query"]` (a Query or its dict)."""
    query = meta.get("query")
    if isinstance(query, Query):
        return query
    if isinstance(query, dict):
        return Query.from_dict(query)
    raise ValueError("ExpertPolicy needs TurnRequest.meta['query'] (the structured query) for every episode")


@dataclass
class ExpertPolicy(TurnPolicy):
    """The expert behind the `Policy` interface: one generator per episode, keyed by `TurnRequest.episode_id`.

    The first request of an episode starts its solver; each later request sends the last user message (the
    observation) into it. Each episode's seed is derived from the config seed and the episode id, so runs are
    reproducible whatever the batch composition.
    """

    config: ExpertConfig = field(default_factory=ExpertConfig)
    _episodes: dict[str, Generator] = field(default_factory=dict)
    outcomes: dict[str, Outcome] = field(default_factory=dict)

    def episode_seed(self, episode_id: str) -> int:
        return random.Random(f"{self.config.seed}:{episode_id}").randrange(2**31)

    def generate(self, requests: list[TurnRequest]) -> list[TurnResult]:
        return [TurnResult(text=self.next_turn(r)) for r in requests]

    def next_turn(self, request: TurnRequest) -> str:
        generator = self._episodes.get(request.episode_id)
        try:
            if generator is None:
                expert = Expert(query_of(request.meta), self.config, self.episode_seed(request.episode_id))
                generator = expert.solve()
                self._episodes[request.episode_id] = generator
                action = next(generator)
            else:
                action = generator.send(strip_tool_response(request.messages[-1]["content"]))
        except StopIteration as stop:  # asked again after answering: answer nothing new
            self.outcomes[request.episode_id] = stop.value
            self._episodes.pop(request.episode_id, None)
            return "<think>I already answered.</think><answer>[]</answer>"
        if action.plan is not None:
            self._episodes.pop(request.episode_id, None)
        return action.text()
