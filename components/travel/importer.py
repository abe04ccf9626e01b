"""Import the real TravelPlanner database into a world directory (Parquet + manifest).

Reads both layouts: the official one (`database/<table>/<file>.csv`) and the flat one of the Agent-STAR release
(`database/<file>.csv`), and applies the official load rules before writing: the unnamed index column is dropped,
accommodation rows with any empty field are dropped (5,047 -> 4,285), and only the first row of a duplicate
distance pair is kept. Flights are optional (the real CSV is 305 MB and not in git); `flights_from_ref_info`
builds a flights table from the flight rows quoted in the benchmark's reference information instead.
"""
from __future__ import annotations

import csv
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from components.errors import UserError
from components.travel.world import (
    NUMBER,
    TABLE_SCHEMAS,
    TEXT,
    ACCOMMODATION_COLUMNS,
    ATTRACTION_COLUMNS,
    DISTANCE_COLUMNS,
    FLIGHT_COLUMNS,
    RESTAURANT_COLUMNS,
    column_kind,
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


WHERE_TO_GET = (
    "The official database is published with the TravelPlanner benchmark (github.com/OSU-NLP-Group/TravelPlanner: "
    "the database archive its README links to); unzip it so that {source}/database/flights/clean_Flights_2022.csv "
    "and the other tables exist, then rerun (docs/operations.md, \"The real database\")."
)


class DatabaseNotFoundError(UserError):
    """The source directory does not hold a TravelPlanner database."""


def missing_database(source: str | Path, what: str) -> DatabaseNotFoundError:
    """The error for a database folder that is absent or incomplete: what is missing, where to get the database."""
    return DatabaseNotFoundError(f"{what}. {WHERE_TO_GET.format(source=source)}")


def find_source_file(source_dir: str | Path, table: str) -> Path | None:
    """Locate a table's file in either layout (`<dir>/database/...`, or `<dir>` being the database folder)."""
    folder, name = SOURCE_FILES[table]
    root = Path(source_dir)
    for base in (root / "database", root):
        for candidate in (base / folder / name, base / name):
            if candidate.exists():
                return candidate
    return None


class DatabaseFormatError(UserError):
    """A database file holds a column that is not what the official database holds there."""


def _text_columns(table: str) -> list[str]:
    return [column for column, kind in TABLE_SCHEMAS[table].items() if kind == TEXT]


def _first_non_number(values: Any) -> tuple[int, str] | None:
    """(data row, value) of the first value that is not a number, or None."""
    for row, value in enumerate(values, start=1):
        if value is None:
            continue
        try:
            float(str(value).replace(",", ""))
        except ValueError:
            return row, str(value)
    return None


def check_columns(table: str, path: Path, schema: pa.Schema, column_values: Any) -> None:
    """Refuse a table whose columns are missing or not of the official kind, naming the file and the column;
    `column_values(name)` gives a column's values, to quote the first one that is not a number."""
    missing = [c for c in TABLE_SCHEMAS[table] if c not in schema.names]
    if missing:
        raise DatabaseFormatError(f"{path} lacks the columns {missing} (it has {schema.names}): it is not the "
                                  f"official {SOURCE_FILES[table][1]}; re-download the database")
    for column, kind in TABLE_SCHEMAS[table].items():
        found = column_kind(schema.field(column).type)
        if found == kind or pa.types.is_null(schema.field(column).type):
            continue
        culprit = _first_non_number(column_values(column)) if kind == NUMBER else None
        quoted = f" (data row {culprit[0]}: {culprit[1]!r})" if culprit else ""
        holds = found or str(schema.field(column).type)
        raise DatabaseFormatError(
            f"{path}: column {column!r} must hold {kind} values as in the official database, but holds "
            f"{holds}{quoted}; fix the file or re-download the database")


def _read_csv(path: Path, table: str) -> pd.DataFrame:
    """Read an official CSV as the official loader does (round-trip floats, the unnamed index column dropped), with
    the text columns kept as the file's text, and check it against the table's schema."""
    frame = pd.read_csv(path, float_precision="round_trip", dtype={c: str for c in _text_columns(table)})
    unnamed = [c for c in frame.columns if str(c).startswith("Unnamed:") or str(c) == ""]
    frame = frame.drop(columns=unnamed)
    columns = [c for c in TABLE_SCHEMAS[table] if c in frame.columns]
    check_columns(table, path, pa.Schema.from_pandas(frame[columns], preserve_index=False),
                  lambda column: frame[column].tolist())
    return frame


def load_accommodations(path: Path) -> pd.DataFrame:
    """Accommodations as the official tool loads them: rows with any empty field dropped."""
    return _read_csv(path, "accommodations").dropna().reset_index(drop=True)[list(ACCOMMODATION_COLUMNS)]


def load_restaurants(path: Path) -> pd.DataFrame:
    return _read_csv(path, "restaurants").dropna().reset_index(drop=True)[list(RESTAURANT_COLUMNS)]


def load_attractions(path: Path) -> pd.DataFrame:
    return _read_csv(path, "attractions").dropna().reset_index(drop=True)[list(ATTRACTION_COLUMNS)]


def load_distance(path: Path) -> pd.DataFrame:
    """Distance rows with the first row kept on duplicate (origin, destination) pairs; the empty `cost` dropped."""
    frame = _read_csv(path, "distance")[list(DISTANCE_COLUMNS)]
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
    """The official flights CSV (3.8 M rows) read with pyarrow as the official loader reads it with pandas: dates,
    times and durations as the file's text (no type inference), rows with an empty field dropped."""
    with path.open(newline="") as handle:
        names = next(csv.reader(handle), [])
    missing = [c for c in FLIGHT_COLUMNS if c not in names]
    if missing:
        raise DatabaseFormatError(f"{path} lacks the columns {missing} (it has {names}): it is not the official "
                                  f"clean_Flights_2022.csv; re-download the database")
    options = pacsv.ConvertOptions(include_columns=list(FLIGHT_COLUMNS), strings_can_be_null=True,
                                   column_types={c: pa.string() for c in _text_columns("flights")})
    table = pacsv.read_csv(path, convert_options=options)
    if any(column.null_count for column in table.columns):  # a copy of 3.8 M rows only where a row is dropped
        table = table.drop_null()
    check_columns("flights", path, table.schema, lambda column: table[column].to_pylist())
    return table


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
        raise missing_database(source_dir, f"no TravelPlanner database at {source_dir}: the folder does not exist")
    paths = {t: find_source_file(source_dir, t) for t in SOURCE_FILES}
    missing = [SOURCE_FILES[t][1] for t, p in paths.items() if p is None and t != "flights"]
    if missing:
        raise missing_database(source_dir, f"{source_dir} is not a TravelPlanner database: {missing} not found "
                                           f"under database/<table>/ or database/")
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


def write_flights_csv(flights: pd.DataFrame, path: str | Path) -> Path:
    """Write a flights table as the official `clean_Flights_2022.csv` is written: an unnamed index column first,
    then the official columns, dates and times as text."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    flights[list(FLIGHT_COLUMNS)].reset_index(drop=True).to_csv(path, index=True)
    return path


def lay_out_reference(reference_dir: str | Path, out_dir: str | Path) -> Path:
    """Lay a reference copy of the benchmark (flat `database/*.csv` plus `fixtures/train_ref_info.jsonl`) out as the
    official database (`<out>/database/<table>/<file>`), with a flights CSV in the official format made of the flight
    rows its reference information quotes; returns `out_dir`, ready for `star world import --source`."""
    reference_dir, out_dir = Path(reference_dir), Path(out_dir)
    ref_info = reference_dir / "fixtures" / "train_ref_info.jsonl"
    if not ref_info.is_file():
        raise DatabaseNotFoundError(f"{reference_dir} has no fixtures/train_ref_info.jsonl to take flights from")
    for table, (folder, name) in SOURCE_FILES.items():
        if table == "flights":
            continue
        source = find_source_file(reference_dir, table)
        if source is None:
            raise DatabaseNotFoundError(f"{reference_dir} lacks {name} (under database/ or database/{folder}/)")
        target = out_dir / "database" / folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    flights_folder, flights_name = SOURCE_FILES["flights"]
    write_flights_csv(flights_from_ref_info(ref_info), out_dir / "database" / flights_folder / flights_name)
    return out_dir
