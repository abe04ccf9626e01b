"""Benchmark the evaluator: plans per second, ours vs the public code's pandas lookups, on the same plans.

Both sides run the same official-mode rules (components.travel.evaluate) over the 45 human gold plans against the
real database; only the data access differs:
  - ours: the World's hash indexes plus a lazily filled per-world cache of name matches within one city;
  - baseline: what the public evaluator does for every name, a pandas scan of the whole table
    (df[df['Name'].astype(str).str.contains(re.escape(name)) & (df['City'] == city)]), flights by
    df[df['Flight Number'] == n] and routes by df[(df.origin == a) & (df.destination == b)].
The flights table is the reference flights padded with generated rows in the same schema (--flight-rows) since the
3.8 M-row CSV is not in the shared data. "cold" clears our name cache before every pass over the plans.

    python benchmarks/bench_evaluator.py                       # 1 M flight rows, ~1 minute on 2 cores
    python benchmarks/bench_evaluator.py --flight-rows 100000  # quick
"""
from __future__ import annotations

import argparse
import json
import platform
import re
import time
from pathlib import Path

import numpy as np
import pandas as pd

from components.travel import checks
from components.travel import evaluate as evaluator
from components.travel.importer import read_database
from components.travel.plans import parse_plan
from components.travel.tasks import load_queries
from components.travel.world import FLIGHT_COLUMNS, World

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "../shared/data/travelplanner"
QUERIES = ROOT / "tests" / "fixtures" / "train_queries.jsonl"


def padded_flights(reference: pd.DataFrame, rows: int, seed: int = 0) -> pd.DataFrame:
    """The reference flights plus generated rows (same schema, unused flight numbers) up to `rows` rows."""
    extra = rows - len(reference)
    if extra <= 0:
        return reference
    rng = np.random.default_rng(seed)
    cities = np.array(sorted(set(reference["OriginCityName"]) | set(reference["DestCityName"])))
    dates = np.array([f"2022-03-{d:02d}" for d in range(1, 32)] + [f"2022-04-{d:02d}" for d in range(1, 31)])
    numbers = 5_000_000 + np.arange(extra)  # reference numbers are below F5000000
    filler = pd.DataFrame({
        "Flight Number": [f"F{n:07d}" for n in numbers],
        "Price": rng.integers(50, 1200, extra),
        "DepTime": [f"{h:02d}:{m:02d}" for h, m in zip(rng.integers(0, 24, extra), rng.integers(0, 60, extra))],
        "ArrTime": [f"{h:02d}:{m:02d}" for h, m in zip(rng.integers(0, 24, extra), rng.integers(0, 60, extra))],
        "ActualElapsedTime": "2 hours 5 minutes",
        "FlightDate": rng.choice(dates, extra),
        "OriginCityName": rng.choice(cities, extra),
        "DestCityName": rng.choice(cities, extra),
        "Distance": rng.integers(100, 3000, extra).astype(float),
    })
    return pd.concat([reference, filler], ignore_index=True)[list(FLIGHT_COLUMNS)]


class PandasTables:
    """The public evaluator's data access: a boolean pandas filter over the whole table for every lookup."""

    def __init__(self, frames: dict[str, pd.DataFrame], world: World):
        self.restaurants = frames["restaurants"]
        self.attractions = frames["attractions"]
        self.accommodations = frames["accommodations"]
        self.flights = frames["flights"]
        self.distances = frames["distance"]
        self._world = world  # only for state_of: the public code uses a dict for the city -> state map too

    # NameLookup's interface
    def official(self, kind: str, name: str, city: str) -> list[dict]:
        table, name_col, city_col = {
            "restaurant": (self.restaurants, "Name", "City"),
            "attraction": (self.attractions, "Name", "City"),
            "accommodation": (self.accommodations, "NAME", "city"),
        }[kind]
        hit = table[table[name_col].astype(str).str.contains(re.escape(name)) & (table[city_col] == city)]
        return hit.to_dict("records")

    # the World methods the official checks call
    def flight(self, number: str) -> dict | None:
        hit = self.flights[self.flights["Flight Number"] == number]
        return None if hit.empty else hit.iloc[0].to_dict()

    def distance(self, origin: str, destination: str) -> dict | None:
        d = self.distances
        hit = d[(d["origin"] == origin) & (d["destination"] == destination)]
        if hit.empty:
            return None
        row = hit.iloc[0]
        return self._world.distance(row["origin"], row["destination"])

    def state_of(self, city: str) -> str | None:
        return self._world.state_of(city)


def gold_plans() -> list:
    lines = (DATA / "fixtures" / "train_gold_plans_messages.jsonl").read_text().splitlines()
    queries = load_queries(QUERIES)
    return [(q, parse_plan(json.loads(line)["messages"][2]["content"])[0]) for q, line in zip(queries, lines)]


def throughput(fn, pairs: list, min_seconds: float, before_pass=None) -> float:
    """Plans per second of `fn(query, plan)` over repeated passes of `pairs` (at least `min_seconds`)."""
    done, start = 0, time.perf_counter()
    while True:
        if before_pass:
            before_pass()
        for query, plan in pairs:
            fn(query, plan)
        done += len(pairs)
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return done / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flight-rows", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=5.0, help="minimum measuring time per variant")
    args = parser.parse_args()

    t0 = time.perf_counter()
    frames = read_database(DATA / "database", flights_from=DATA / "fixtures" / "train_ref_info.jsonl")
    frames["flights"] = padded_flights(frames["flights"], args.flight_rows)
    world = World.from_frames(**frames)
    pandas_tables = PandasTables(frames, world)
    pairs = gold_plans()
    print(f"loaded world ({len(frames['flights']):,} flights) and {len(pairs)} gold plans "
          f"in {time.perf_counter() - t0:.1f} s")

    # Same rules, same plans: the verdicts must agree before speeds are compared.
    for query, plan in pairs:
        ours = evaluator.evaluate_plan(world, query, plan, "official")
        base = evaluator.evaluate_plan(pandas_tables, query, plan, "official", lookup=pandas_tables)
        assert ours.to_dict() == base.to_dict(), f"verdicts differ on query {query.idx}"

    def clear_cache():
        checks._LOOKUPS.clear()

    results = {
        "baseline pandas (official)": throughput(
            lambda q, p: evaluator.evaluate_plan(pandas_tables, q, p, "official", lookup=pandas_tables),
            pairs, args.seconds),
        "ours official, cold cache": throughput(
            lambda q, p: evaluator.evaluate_plan(world, q, p, "official"), pairs, args.seconds, clear_cache),
        "ours official, warm cache": throughput(
            lambda q, p: evaluator.evaluate_plan(world, q, p, "official"), pairs, args.seconds),
        "ours strict, cold cache": throughput(
            lambda q, p: evaluator.evaluate_plan(world, q, p, "strict"), pairs, args.seconds, clear_cache),
        "ours both modes, warm cache": throughput(
            lambda q, p: evaluator.evaluate_both(world, q, p), pairs, args.seconds),
    }
    baseline = results["baseline pandas (official)"]
    print(f"\nmachine: {platform.platform()}, python {platform.python_version()}")
    print(f"{'variant':<32}{'plans/s':>12}{'vs baseline':>14}")
    for name, rate in results.items():
        print(f"{name:<32}{rate:>12,.1f}{rate / baseline:>13.1f}x")


if __name__ == "__main__":
    main()
