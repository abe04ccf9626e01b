"""Benchmark importing the official flights CSV at the real data's scale (~3.8 M rows), against the official loader.

A synthetic flights table in the official schema is written as `clean_Flights_2022.csv` is (an unnamed index column,
dates and times as text); then, side by side in one process on that file:
  - ours: `components.travel.importer.load_flights_csv` (pyarrow, text columns kept as text, schema-checked), and
  - the official loader: `pd.read_csv(path).dropna()[columns]` (the benchmark's `tools/flights/apis.py`).
Both must give the same values, column by column; the script prints each reader's best time and the ratio.

    python benchmarks/bench_import.py                 # ~3.8 M rows, a few minutes on 2 cores
    python benchmarks/bench_import.py --scale 0.1     # a quick run
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_tools import WORK, bench_params  # noqa: E402
from components.travel.importer import load_flights_csv, write_flights_csv  # noqa: E402
from components.travel.synthetic import synthesize_world  # noqa: E402
from components.travel.world import FLIGHT_COLUMNS  # noqa: E402


def best_of(readers: dict, repeat: int) -> tuple[dict, dict]:
    """Each reader's fastest of `repeat` runs, the readers alternating (the first pyarrow call in a process also
    starts its thread pool); returns (seconds by reader, the last value of each)."""
    seconds, values = {name: [] for name in readers}, {}
    for _ in range(repeat):
        for name, read in readers.items():
            start = time.perf_counter()
            values[name] = read()
            seconds[name].append(time.perf_counter() - start)
    return {name: min(times) for name, times in seconds.items()}, values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="flight density (1.0 = about 3.8 M rows)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each reader (the fastest counts)")
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"python {platform.python_version()}")
    frames, _ = synthesize_world(bench_params(args.scale))
    path = write_flights_csv(frames["flights"].to_pandas(), WORK / "database" / "flights" / "clean_Flights_2022.csv")
    print(f"wrote {path} ({path.stat().st_size / 2**20:.0f} MiB, {frames['flights'].num_rows:,} rows)")
    del frames

    seconds, values = best_of({"ours": lambda: load_flights_csv(path),
                               "official": lambda: pd.read_csv(path).dropna()[list(FLIGHT_COLUMNS)]}, args.repeat)
    ours, official = values["ours"].to_pandas(), values["official"]
    for column in FLIGHT_COLUMNS:
        assert ours[column].tolist() == official[column].tolist(), column
    print(f"same values in all {len(FLIGHT_COLUMNS)} columns of {len(official):,} rows "
          f"(FlightDate {ours['FlightDate'].iloc[0]!r}, DepTime {ours['DepTime'].iloc[0]!r})")
    print(f"best of {args.repeat}: ours (pyarrow, schema-checked) {seconds['ours']:.2f} s, "
          f"official pd.read_csv().dropna() {seconds['official']:.2f} s; "
          f"ours / official {seconds['ours'] / seconds['official']:.2f}")


if __name__ == "__main__":
    main()
