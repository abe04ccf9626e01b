"""Import the real TravelPlanner database into a world directory (Parquet + manifest).

Reads both layouts: the official one (`database/<table>/<file>.csv`) and the flat one of the Agent-STAR release
(`database/<file>.csv`), and applies the official load rules before writing: the unnamed index column is dropped,
accommodation rows with any empty field are dropped (5,047 -> 4,285), and only the first row of a duplicate
distance pair is kept. Flights are optional (the real CSV is 305 MB and not in git); `flights_from_ref_info`
builds a flights table from the flight rows quoted in the benchmark's reference information instead.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from components.errors import UserError
from components.travel.world import (
    ACCOMMODATION_COLUMNS,
    ATTRACTION_COLUMNS,
    DISTANCE_COLUMNS,
    FLIGHT_COLUMNS,
    RESTAURANT_COLUMNS,
    write_world,
)

log = logging.getLogger(__name__)

# table -> (official sub-folder, file name)
SOURCE_FILES = {
    "flights": ("flights", "clean_Flights_2022.csv"),
    "accommodations": ("accommodations", "clean_accommodations_2022.csv"),
    "restaurants": ("restaurants", "clean_restaurant_2022.csv"),
    "attractions": ("attractions", "attractions.csv"),
    "distance": ("googleDistanceMatrix", "distance.csv"),
    "cities": ("background", "citySet_with_states.txt"),
}


class DatabaseNotFoundError(UserError):
    """The source directory does not hold a TravelPlanner database."""


def find_source_file(source_dir: str | Path, table: str) -> Path | None:
    """Locate a table's file in either layout (`<dir>/database/...`, or `<dir>` being the database folder)."""
    folder, name = SOURCE_FILES[table]
    root = Path(source_dir)
    for base in (root / "database", root):
        for candidate in (base / folder / name, base / name):
            if candidate.exists():
                return candidate
    return None


def _read_csv(path: Path) -> pd.DataFrame:
    """Read an official CSV exactly (round-trip floats) and drop the unnamed index column."""
    frame = pd.read_csv(path, float_precision="round_trip")
    unnamed = [c for c in frame.columns if str(c).startswith("Unnamed:") or str(c) == ""]
    return frame.drop(columns=unnamed)


def load_accommodations(path: Path) -> pd.DataFrame:
    """Accommodations as the official tool loads them: rows with any empty field dropped."""
    return _read_csv(path).dropna().reset_index(drop=True)[list(ACCOMMODATION_COLUMNS)]


def load_restaurants(path: Path) -> pd.DataFrame:
    return _read_csv(path).dropna().reset_index(drop=True)[list(RESTAURANT_COLUMNS)]


def load_attractions(path: Path) -> pd.DataFrame:
    return _read_csv(path).dropna().reset_index(drop=True)[list(ATTRACTION_COLUMNS)]


def load_distance(path: Path) -> pd.DataFrame:
    """Distance rows with the first row kept on duplicate (origin, destination) pairs; the empty `cost` dropped."""
    frame = _read_csv(path)[list(DISTANCE_COLUMNS)]
    return frame.drop_duplicates(subset=["origin", "destination"], keep="first").reset_index(drop=True)


def load_cities(path: Path) -> pd.DataFrame:
    """`citySet_with_states.txt`: one `City<TAB>State` per line."""
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 2:
            raise DatabaseNotFoundError(f"{path}:{number}: expected 'City<TAB>State', got {line!r}")
        rows.append({"City": parts[0].strip(), "State": parts[1].strip()})
    return pd.DataFrame(rows, columns=["City", "State"])


def load_flights_csv(path: Path) -> pa.Table:
    """The official flights CSV (3.8 M rows) read with pyarrow; rows with an empty field dropped (official)."""
    table = pacsv.read_csv(path)
    table = table.select([c for c in table.column_names if c and not c.startswith("Unnamed")])
    table = table.drop_null()
    return table.select(list(FLIGHT_COLUMNS))


def flights_from_ref_info(path: str | Path) -> pd.DataFrame:
    """A flights table made of every flight row quoted in a `train_ref_info.jsonl` file (first copy kept)."""
    path = Path(path)
    if not path.exists():
        raise DatabaseNotFoundError(f"reference-info file {path} does not exist")
    rows, seen = [], set()
    with path.open() as handle:
        for line in handle:
            if not line.strip():
                continue
            for description, content in json.loads(line).items():
                if not description.startswith("Flight from") or not isinstance(content, list):
                    continue
                for row in content:
                    key = (row["Flight Number"], row["FlightDate"], row["OriginCityName"], row["DestCityName"])
                    if key not in seen:
                        seen.add(key)
                        rows.append({c: row[c] for c in FLIGHT_COLUMNS})
    return empty_flights() if not rows else pd.DataFrame(rows, columns=list(FLIGHT_COLUMNS))


def empty_flights() -> pd.DataFrame:
    """A flights table with the official columns and types and no rows."""
    return pd.DataFrame({
        "Flight Number": pd.Series(dtype=str), "Price": pd.Series(dtype="int64"), "DepTime": pd.Series(dtype=str),
        "ArrTime": pd.Series(dtype=str), "ActualElapsedTime": pd.Series(dtype=str),
        "FlightDate": pd.Series(dtype=str), "OriginCityName": pd.Series(dtype=str),
        "DestCityName": pd.Series(dtype=str), "Distance": pd.Series(dtype="float64"),
    })


def read_database(source_dir: str | Path, flights_from: str | Path | None = None) -> dict:
    """Read every table of a TravelPlanner database into frames, with the official load rules applied."""
    source_dir = Path(source_dir)
    if not source_dir.exists():
        raise DatabaseNotFoundError(f"source directory {source_dir} does not exist")
    paths = {t: find_source_file(source_dir, t) for t in SOURCE_FILES}
    missing = [SOURCE_FILES[t][1] for t, p in paths.items() if p is None and t != "flights"]
    if missing:
        raise DatabaseNotFoundError(
            f"{source_dir} is not a TravelPlanner database: {missing} not found under "
            f"database/<table>/ or database/ (download the benchmark's database)"
        )
    frames = {
        "accommodations": load_accommodations(paths["accommodations"]),
        "restaurants": load_restaurants(paths["restaurants"]),
        "attractions": load_attractions(paths["attractions"]),
        "distance": load_distance(paths["distance"]),
        "cities": load_cities(paths["cities"]),
    }
    if flights_from is not None:
        frames["flights"] = flights_from_ref_info(flights_from)
    elif paths["flights"] is not None:
        frames["flights"] = load_flights_csv(paths["flights"])
    else:
        log.warning("no flights table (clean_Flights_2022.csv) under %s: the world has no flights; pass "
                    "--flights-from-ref-info FILE or add the official flights CSV", source_dir)
        frames["flights"] = empty_flights()
    return frames


def import_database(source_dir: str | Path, out_dir: str | Path, flights_from_ref_info: str | Path | None = None,
                    prompt_style: str = "full") -> dict:
    """Import a real database into `out_dir` (Parquet per table + manifest.json); returns the manifest."""
    frames = read_database(source_dir, flights_from=flights_from_ref_info)
    source = str(Path(source_dir).resolve())
    params = {"flights_from_ref_info": str(flights_from_ref_info)} if flights_from_ref_info else None
    return write_world(frames, out_dir, source=source, params=params, prompt_style=prompt_style)
