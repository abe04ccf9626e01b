"""Feasibility of a query skeleton (query synthesis, step 3): cheap checks on the world's tables first,
then the proof: the expert's solver, calling the real tools, must find a plan within the budget.

Every rejection carries a short reason key, so `metrics/queries.json` can say why skeletons were dropped.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from components.travel.expert import ExpertConfig, Outcome, cuisines_of, solve_with_tools, stay_fits
from components.travel.skeleton import destination_cities
from components.travel.tasks import Query

REJECTION_REASONS = ("no_route", "no_stay", "no_cuisine", "solver_route", "solver_leg", "solver_city",
                     "solver_cuisine", "solver_fill", "solver_budget")


@dataclass(frozen=True)
class Verdict:
    """Feasible or not, why not, and the solver's outcome when it ran."""

    feasible: bool
    reason: str | None = None
    outcome: Outcome | None = None


def reachable(world: Any, origin: str, destination: str, day: str, transportation: str | None,
              min_flights: int) -> bool:
    """A leg is possible: a valid road route (unless self-driving and taxi are both impossible), or at least
    `min_flights` flights that day (unless flights are banned)."""
    road = world.distance(origin, destination)
    if road and road["valid"]:
        return True  # taxi is allowed under every transportation rule
    return transportation != "no flight" and len(world.flights_on(origin, destination, day)) >= min_flights


def precheck(world: Any, query: Query, min_flights: int) -> str | None:
    """The first cheap reason this query cannot work, or None: no way in and out, too few cities with a fitting
    stay, or a required cuisine served nowhere on the trip."""
    cities = destination_cities(world, {"visiting_city_number": query.visiting_city_number, "dest": query.dest,
                                        "org": query.org})
    way_in = [c for c in cities if reachable(world, query.org, c, query.date[0], query.transportation, min_flights)]
    way_out = [c for c in cities if reachable(world, c, query.org, query.date[-1], query.transportation, min_flights)]
    if not way_in or not way_out:
        return "no_route"
    hosts = [c for c in cities if any(stay_fits(r, query) for r in world.accommodations_in(c))]
    if len(hosts) < query.visiting_city_number:
        return "no_stay"
    served = set().union(*(cuisines_of(r) for c in hosts for r in world.restaurants_in(c))) if hosts else set()
    if any(c not in served for c in (query.cuisine or [])):
        return "no_cuisine"
    return None


def check_feasible(world: Any, query: Query, config: ExpertConfig = ExpertConfig(), min_flights: int = 3,
                   seed: int = 0) -> Verdict:
    """Prove a query feasible: the prechecks pass and the solver (mistake-free) finds a plan within budget."""
    reason = precheck(world, query, min_flights)
    if reason:
        return Verdict(False, reason)
    outcome, _ = solve_with_tools(world, query, ExpertConfig(mistake_rate=0.0, max_routes=config.max_routes,
                                                             shortlist=config.shortlist, seed=seed,
                                                             max_tool_calls=config.max_tool_calls))
    if outcome.plan is None:
        return Verdict(False, f"solver_{outcome.failure_kind or 'budget'}", outcome)
    return Verdict(True, None, outcome)
