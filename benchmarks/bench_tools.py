"""Benchmark the sandbox at the real data's scale: a 3.8 M-row flights table.

Side by side in one process, over the same random (origin, destination, date) keys:
  - our SearchFlight (sorted columnar index: dict lookups + a binary search to a row range), and
  - the public code's lookup, a pandas boolean filter over the whole table
    (df[(df.OriginCityName == a) & (df.DestCityName == b) & (df.FlightDate == d)]).
Also: world load time and peak memory (in a fresh subprocess, ru_maxrss), flight-number lookups, and the
environment's overhead per step (protocol parse + tool + observation render).

    python benchmarks/bench_tools.py                 # ~3.8 M flights, about two minutes on 2 cores
    python benchmarks/bench_tools.py --scale 0.1     # a quick run
"""
from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from components.travel.synthetic import WorldParams, synthesize_world
from components.travel.world import World, write_world

WORK = Path(__file__).resolve().parent / "_work"


def bench_params(scale: float) -> WorldParams:
    """50 states x 6 cities, March-April 2022: about 3.8 M flights at scale 1 (flight density scales)."""
    return WorldParams(states=50, cities_per_state=(6, 6), holdout_states=0, num_dates=61,
                       drive_only_fraction=0.1, flight_route_fraction=0.55 * scale, flights_per_route_day=(1, 2),
                       flight_day_fraction=0.9, flight_id_digits=7, seed=0)


def per_call(fn, calls: list, repeat: int = 1) -> float:
    """Mean seconds per call of `fn(*args)` over `calls`."""
    start = time.perf_counter()
    for _ in range(repeat):
        for args in calls:
            fn(*args)
    return (time.perf_counter() - start) / (len(calls) * repeat)


def measure_load(world_dir: Path) -> dict:
    """World.load in a fresh interpreter: seconds and peak resident memory (VmHWM, Linux)."""
    code = (
        "import json, time\n"
        "def hwm():\n"
        "    line = [x for x in open('/proc/self/status') if x.startswith('VmHWM')][0]\n"
        "    return int(line.split()[1]) / 1024\n"
        "from components.travel.world import World\n"
        "imported = hwm()\n"
        "t1 = time.perf_counter()\n"
        f"w = World.load({str(world_dir)!r})\n"
        "t2 = time.perf_counter()\n"
        "print(json.dumps({'load_s': t2 - t1, 'peak_rss_mb': hwm(), 'rss_after_import_mb': imported,"
        " 'index_mb': w.flights.nbytes() / 2**20, 'rows': w.flights.num_rows}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="flight density (1.0 = about 3.8 M rows)")
    parser.add_argument("--pandas-calls", type=int, default=40)
    parser.add_argument("--index-calls", type=int, default=20000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)

    t = time.perf_counter()
    frames, _ = synthesize_world(bench_params(args.scale))
    synth_s = time.perf_counter() - t
    n = frames["flights"].num_rows
    print(f"machine: {platform.processor() or platform.machine()}, {__import__('os').cpu_count()} cores, "
          f"python {platform.python_version()}")
    print(f"synthesised {n:,} flight rows in {synth_s:.2f} s")

    world_dir = WORK / "bench_world"
    t = time.perf_counter()
    write_world(frames, world_dir, source="synthetic")
    print(f"wrote the world (Parquet + manifest) in {time.perf_counter() - t:.2f} s; "
          f"flights.parquet {(world_dir / 'flights.parquet').stat().st_size / 2**20:.1f} MiB")

    load = measure_load(world_dir)
    print(f"World.load: {load['load_s']:.2f} s, peak RSS {load['peak_rss_mb']:.0f} MiB "
          f"(interpreter + imports {load['rss_after_import_mb']:.0f} MiB), flight index arrays "
          f"{load['index_mb']:.0f} MiB for {load['rows']:,} rows")

    from components.travel.env import TravelEnv
    from components.travel.tools import call_tool

    world = World.load(world_dir)
    df = frames["flights"].to_pandas()
    for column in ("OriginCityName", "DestCityName", "FlightDate"):  # plain strings, as pd.read_csv gives them
        df[column] = df[column].astype(str)
    print(f"pandas frame: {len(df):,} rows, key dtypes {df['OriginCityName'].dtype}")

    picks = rng.integers(0, n, size=args.index_calls)
    keys = list(zip(df["OriginCityName"].values[picks], df["DestCityName"].values[picks],
                    df["FlightDate"].values[picks]))

    def pandas_lookup(a, b, d):
        return df[(df.OriginCityName == a) & (df.DestCityName == b) & (df.FlightDate == d)]

    def ours(a, b, d):
        return call_tool(world, "SearchFlight", {"departure": a, "destination": b, "date": d})

    for a, b, d in keys[:20]:  # same answers
        expected = pandas_lookup(a, b, d)["Flight Number"].tolist()
        assert [r["Flight Number"] for r in world.flights_on(a, b, d)] == expected

    pandas_s = per_call(pandas_lookup, keys[: args.pandas_calls])
    index_s = per_call(lambda a, b, d: world.flights_on(a, b, d), keys)
    tool_s = per_call(ours, keys)
    numbers = frames["flights"]["Flight Number"].to_numpy(zero_copy_only=False)[picks[:5000]]
    number_s = per_call(world.flight, [(x,) for x in numbers])
    pandas_number_s = per_call(lambda x: df[df["Flight Number"] == x], [(x,) for x in numbers[:20]])
    mean_rows = float(np.mean([len(world.flights_on(*k)) for k in keys[:2000]]))
    print(f"flights per key: {mean_rows:.2f} on average")
    print(f"pandas boolean filter: {pandas_s * 1e3:9.2f} ms per call ({args.pandas_calls} calls)")
    print(f"world.flights_on:      {index_s * 1e6:9.2f} us per call ({len(keys)} calls)  "
          f"-> {pandas_s / index_s:,.0f}x faster")
    print(f"SearchFlight (tool, rendered text): {tool_s * 1e6:9.2f} us per call  -> {pandas_s / tool_s:,.0f}x faster")
    print(f"flight(number): {number_s * 1e6:.2f} us per call vs pandas {pandas_number_s * 1e3:.2f} ms "
          f"-> {pandas_number_s / number_s:,.0f}x")

    query = {"query": "Plan a trip."}
    env = TravelEnv(world, query)
    env.reset()
    turns = [(f'<think>check flights</think><tool_call>{{"name": "SearchFlight", "arguments": '
              f'{{"departure": "{a}", "destination": "{b}", "date": "{d}"}}}}</tool_call>',) for a, b, d in keys[:5000]]
    step_s = per_call(env.step, turns)
    city = world.cities[0]
    listing_turn = (f'<think>stays</think><tool_call>{{"name": "SearchAccommodation", "arguments": '
                    f'{{"city": "{city}"}}}}</tool_call>',)
    listing_s = per_call(env.step, [listing_turn] * 2000)
    bad_s = per_call(env.step, [("no format here",)] * 2000)
    print(f"env.step (parse + SearchFlight + render + tool_response): {step_s * 1e6:.1f} us per step")
    print(f"env.step (SearchAccommodation, {len(world.accommodations_in(city))} rows): {listing_s * 1e6:.1f} us")
    print(f"env.step (protocol error): {bad_s * 1e6:.1f} us")
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
