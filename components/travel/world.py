"""The TravelPlanner world: immutable tables with hash indexes built once at load.

Small tables (accommodations, restaurants, attractions, distance, cities) become dicts of row dicts keyed by city
or (origin, destination). The flights table (3.8 M rows in the real data) stays columnar: its rows are sorted by
(origin, destination, date), so `flights_on` is two dict lookups plus a binary search to a row range, and
`flight(number)` is a binary search over the encoded flight numbers. Nothing here scans a table per call.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from components.errors import UserError

TABLES = ("flights", "accommodations", "restaurants", "attractions", "distance", "cities")

TEXT, NUMBER = "text", "number"
# Every table's columns as the official loader (`pd.read_csv(...).dropna()`) reads them: dates, times, durations and
# distances stay the text of the file ("2022-03-16", "15:40", "1 hour 5 mins", "1,433 km"); only these are numbers.
TABLE_SCHEMAS: dict[str, dict[str, str]] = {
    "flights": {
        "Flight Number": TEXT, "Price": NUMBER, "DepTime": TEXT, "ArrTime": TEXT, "ActualElapsedTime": TEXT,
        "FlightDate": TEXT, "OriginCityName": TEXT, "DestCityName": TEXT, "Distance": NUMBER,
    },
    "accommodations": {
        "NAME": TEXT, "price": NUMBER, "room type": TEXT, "house_rules": TEXT, "minimum nights": NUMBER,
        "maximum occupancy": NUMBER, "review rate number": NUMBER, "city": TEXT,
    },
    "restaurants": {"Name": TEXT, "Average Cost": NUMBER, "Cuisines": TEXT, "Aggregate Rating": NUMBER, "City": TEXT},
    "attractions": {
        "Name": TEXT, "Latitude": NUMBER, "Longitude": NUMBER, "Address": TEXT, "Phone": TEXT, "Website": TEXT,
        "City": TEXT,
    },
    "distance": {"origin": TEXT, "destination": TEXT, "duration": TEXT, "distance": TEXT},
    "cities": {"City": TEXT, "State": TEXT},
}
FLIGHT_COLUMNS = tuple(TABLE_SCHEMAS["flights"])
ACCOMMODATION_COLUMNS = tuple(TABLE_SCHEMAS["accommodations"])
RESTAURANT_COLUMNS = tuple(TABLE_SCHEMAS["restaurants"])
ATTRACTION_COLUMNS = tuple(TABLE_SCHEMAS["attractions"])
FLIGHT_DICTIONARY_COLUMNS = (
    "DepTime", "ArrTime", "ActualElapsedTime", "FlightDate", "OriginCityName", "DestCityName",
)
DISTANCE_COLUMNS = tuple(TABLE_SCHEMAS["distance"])
CITY_COLUMNS = tuple(TABLE_SCHEMAS["cities"])

# Flight numbers "F" + k digits are packed into one int64: k * 10**17 + digits (k keeps leading zeros).
_DIGITS_BASE = 10**17
_FLIGHT_NUMBER = re.compile(r"F(\d{1,17})")

_DURATION_PART = re.compile(r"(\d+)\s*(day|hour|min)", re.IGNORECASE)


class WorldError(UserError):
    """A world directory is missing, incomplete or holds a table with the wrong columns."""


def column_kind(data_type: pa.DataType) -> str | None:
    """TEXT or NUMBER for an Arrow type (a dictionary takes its values' kind); None for anything else (dates, times)."""
    if pa.types.is_dictionary(data_type):
        data_type = data_type.value_type
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        return TEXT
    if pa.types.is_integer(data_type) or pa.types.is_floating(data_type):
        return NUMBER
    return None


def schema_problems(schema: pa.Schema, table: str) -> list[str]:
    """What differs between a table's Arrow schema and `TABLE_SCHEMAS[table]`: one line per column, [] when none."""
    problems = []
    for column, kind in TABLE_SCHEMAS[table].items():
        if column not in schema.names:
            problems.append(f"column {column!r} is missing")
            continue
        found = schema.field(column).type
        if column_kind(found) != kind and not pa.types.is_null(found):  # null: an empty table's column
            problems.append(f"column {column!r} is {found}, not {kind} as in the official database")
    return problems


def rebuild_command(directory: str | Path, manifest: Mapping[str, Any]) -> str:
    """The command that writes this world directory anew, from what its manifest says it was made of."""
    source = manifest.get("source")
    if source and source != "synthetic":
        flights = (manifest.get("params") or {}).get("flights_from_ref_info")
        extra = f" --flights-from-ref-info {flights}" if flights else ""
        return f"star world import --source {source} --out {directory}{extra}"
    return f"star world build --out {directory} (the `world` stage: `dvc repro --force world`)"


def parse_km(distance: Any) -> float | None:
    """Parse an official distance text such as "1,433 km" or "1.5 km" into kilometres (None when empty)."""
    if distance is None or (isinstance(distance, float) and math.isnan(distance)):
        return None
    text = str(distance).replace(",", "").replace("km", "").strip()
    try:
        return float(text)
    except ValueError:
        return None


def parse_minutes(duration: Any) -> int | None:
    """Parse "1 day 2 hours", "10 hours 55 mins" or "45 mins" into minutes (None when empty or unreadable)."""
    if duration is None or (isinstance(duration, float) and math.isnan(duration)):
        return None
    parts = _DURATION_PART.findall(str(duration))
    if not parts:
        return None
    scale = {"day": 24 * 60, "hour": 60, "min": 1}
    return sum(int(value) * scale[unit.lower()] for value, unit in parts)


def distance_entry(origin: str, destination: str, duration: Any, distance: Any) -> dict:
    """One distance row with parsed fields; `valid` is False for multi-day or missing routes (official rule)."""
    duration_text = None if duration is None or (isinstance(duration, float) and math.isnan(duration)) else str(duration)
    distance_text = None if distance is None or (isinstance(distance, float) and math.isnan(distance)) else str(distance)
    km = parse_km(distance_text)
    minutes = parse_minutes(duration_text)
    valid = bool(duration_text) and "day" not in duration_text and km is not None
    return {
        "origin": origin, "destination": destination, "duration": duration_text, "distance": distance_text,
        "km": km, "minutes": minutes, "valid": valid,
    }


def _to_table(frame: Any) -> pa.Table:
    """Accept a pyarrow Table or a pandas DataFrame."""
    if isinstance(frame, pa.Table):
        return frame
    return pa.Table.from_pandas(frame, preserve_index=False)


def _require_columns(table: pa.Table, name: str, columns: tuple[str, ...]) -> None:
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise WorldError(
            f"table '{name}' lacks the columns {missing} (it has {table.column_names}); "
            f"re-create the world with `star world import` or `star world synth`"
        )


def _rows(table: pa.Table) -> list[dict]:
    """Rows as dicts with Python values (column names as in the table)."""
    return table.to_pylist()


def _group_rows(rows: list[dict], key: str) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row[key], []).append(row)
    return groups


def _dictionary(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list]:
    """Dictionary-encode a column: (int codes, values as a Python list)."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if not pa.types.is_dictionary(array.type):
        array = pc.dictionary_encode(array)
    codes = array.indices.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return codes, array.dictionary.to_pylist()


def encode_flight_number(number: str) -> int | None:
    """Pack "F0123456" into an int64 (None when the text is not "F" + digits)."""
    match = _FLIGHT_NUMBER.fullmatch(number) if isinstance(number, str) else None
    if not match:
        return None
    digits = match.group(1)
    return len(digits) * _DIGITS_BASE + int(digits)


def decode_flight_number(code: int) -> str:
    """Inverse of `encode_flight_number`."""
    width, digits = divmod(int(code), _DIGITS_BASE)
    return f"F{digits:0{width}d}"


def _encode_flight_numbers(column: pa.ChunkedArray, block: int = 1 << 19) -> np.ndarray | None:
    """Vectorised `encode_flight_number` over a column, in blocks to bound the temporaries; None if any number
    is not "F" + 1..17 digits."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    out = np.empty(len(array), dtype=np.int64)
    if array.null_count:
        return None
    for start in range(0, len(array), block):
        part = array.slice(start, block)
        if not pc.all(pc.match_substring_regex(part, r"^F\d{1,17}$")).as_py():
            return None
        digits = pc.utf8_slice_codeunits(part, 1)
        widths = pc.utf8_length(digits).to_numpy(zero_copy_only=False).astype(np.int64)
        out[start: start + len(part)] = widths * _DIGITS_BASE + pc.cast(digits, pa.int64()).to_numpy(
            zero_copy_only=False)
    return out


def _compact(values: np.ndarray) -> np.ndarray:
    """The smallest dtype that holds `values` exactly (int32 for ints, float32 for floats that round-trip)."""
    if values.dtype.kind in "iu" and (len(values) == 0 or (values.min() >= -2**31 and values.max() < 2**31)):
        return values.astype(np.int32)
    if values.dtype.kind == "f":
        narrow = values.astype(np.float32)
        if np.array_equal(narrow.astype(values.dtype), values, equal_nan=True):
            return narrow
    return values


class FlightIndex:
    """Columnar flights sorted by (origin, destination, date) with a row-range index and a flight-number index.

    Per row it keeps only price, distance, three small time codes and the flight number (about 26 bytes for the
    official "F" + 7 digits); origin, destination and date are implied by the row's key range.
    """

    def __init__(self, table: pa.Table):
        _require_columns(table, "flights", FLIGHT_COLUMNS)
        self._build(lambda name: table[name])

    @classmethod
    def from_parquet(cls, path: str | Path) -> "FlightIndex":
        """Build from a Parquet file one column at a time (peak memory stays near the index's own size)."""
        parquet = pq.ParquetFile(path)
        names = parquet.schema_arrow.names
        missing = [c for c in FLIGHT_COLUMNS if c not in names]
        if missing:
            raise WorldError(f"{path} lacks the columns {missing} (it has {names}); re-create the world")
        index = cls.__new__(cls)

        def read(name: str) -> pa.ChunkedArray:
            dictionary = [name] if name in FLIGHT_DICTIONARY_COLUMNS else None
            column = pq.read_table(path, columns=[name], read_dictionary=dictionary)[name]
            pa.default_memory_pool().release_unused()
            return column

        index._build(read)
        return index

    def _build(self, read: Any) -> None:
        """Sort rows by (origin, destination, date) and keep compact per-row columns; `read(name)` gives a column."""
        origin, self._cities = _dictionary(read("OriginCityName"))
        dest_raw, dest_values = _dictionary(read("DestCityName"))
        # Origin and destination share one city vocabulary so a key is (city code, city code, date code).
        city_code = {c: i for i, c in enumerate(self._cities)}
        for c in dest_values:
            if c not in city_code:
                city_code[c] = len(self._cities)
                self._cities.append(c)
        dest_map = np.array([city_code[c] for c in dest_values], dtype=np.int64)
        self._city_code = city_code
        self._n_cities = max(len(self._cities), 1)
        key = origin * self._n_cities
        del origin
        key += dest_map[dest_raw] if len(dest_raw) else dest_raw
        del dest_raw
        date, self._dates = _dictionary(read("FlightDate"))
        self._date_code = {d: i for i, d in enumerate(self._dates)}
        self._n_dates = max(len(self._dates), 1)
        key *= self._n_dates
        key += date
        del date
        order = np.argsort(key, kind="stable")  # stable: rows of one key keep the file's order
        key = key[order]
        self.num_rows = len(key)
        starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if len(key) else np.zeros(0, dtype=np.int64)
        self._keys = key[starts]
        self._bounds = np.r_[starts, len(key)].astype(np.int64 if len(key) >= 2**31 else np.int32)
        del key, starts

        self._price = _compact(read("Price").to_numpy()[order])
        self._distance = _compact(read("Distance").to_numpy()[order])
        self._dep, self._dep_values = self._codes(read("DepTime"), order)
        self._arr, self._arr_values = self._codes(read("ArrTime"), order)
        self._elapsed, self._elapsed_values = self._codes(read("ActualElapsedTime"), order)
        self._index_numbers(read("Flight Number"), order)
        self._sorted_dates = sorted(self._dates)

    def _index_numbers(self, column: pa.ChunkedArray, order: np.ndarray) -> None:
        """Flight numbers as ints (one width: int32 digits) with a sorted copy for binary search."""
        self._number_text = None
        packed = _encode_flight_numbers(column)
        if packed is None:  # unusual numbering: keep the text and a dict (first row wins)
            texts = column.to_pylist()
            self._number_text = [texts[i] for i in order]
            self._number_lookup: dict[str, int] = {}
            for i, text in enumerate(self._number_text):
                self._number_lookup.setdefault(text, i)
            return
        widths = packed // _DIGITS_BASE
        self._number_width = int(widths[0]) if len(widths) and (widths == widths[0]).all() else None
        if self._number_width is not None and self._number_width <= 9:
            codes = (packed % _DIGITS_BASE).astype(np.int32)
        else:
            self._number_width = None
            codes = packed
        self._number_codes = codes[order]
        by_number = np.argsort(self._number_codes, kind="stable")
        self._number_sorted = self._number_codes[by_number]
        self._number_rows = by_number.astype(np.int32 if self.num_rows < 2**31 else np.int64)

    @staticmethod
    def _codes(column: pa.ChunkedArray, order: np.ndarray) -> tuple[np.ndarray, list]:
        codes, values = _dictionary(column)
        dtype = np.int16 if len(values) < 2**15 else np.int32
        return codes[order].astype(dtype), values

    def _numbers(self, start: int, end: int) -> list[str]:
        if self._number_text is not None:
            return self._number_text[start:end]
        codes = self._number_codes[start:end].tolist()
        if self._number_width is not None:
            return [f"F{c:0{self._number_width}d}" for c in codes]
        return [decode_flight_number(c) for c in codes]

    def _number_code(self, number: str) -> int | None:
        code = encode_flight_number(number)
        if code is None or self._number_width is None:
            return code
        width, digits = divmod(code, _DIGITS_BASE)
        return digits if width == self._number_width else None

    def _rows(self, start: int, end: int, origin: str, destination: str, date: str) -> list[dict]:
        """Rows [start, end) of one key, as dicts with the official column names."""
        dep, arr, elapsed = self._dep_values, self._arr_values, self._elapsed_values
        return [
            {"Flight Number": number, "Price": price, "DepTime": dep[d], "ArrTime": arr[a],
             "ActualElapsedTime": elapsed[e], "FlightDate": date, "OriginCityName": origin,
             "DestCityName": destination, "Distance": distance}
            for number, price, d, a, e, distance in zip(
                self._numbers(start, end), self._price[start:end].tolist(), self._dep[start:end].tolist(),
                self._arr[start:end].tolist(), self._elapsed[start:end].tolist(),
                self._distance[start:end].tolist())
        ]

    def _key_of_row(self, i: int) -> tuple[str, str, str]:
        pos = int(self._bounds.searchsorted(self._bounds.dtype.type(i), side="right")) - 1
        od, t = divmod(int(self._keys[pos]), self._n_dates)
        o, d = divmod(od, self._n_cities)
        return self._cities[o], self._cities[d], self._dates[t]

    def row(self, i: int) -> dict:
        """Row `i` (in sorted order) as a dict with the official column names."""
        return self._rows(i, i + 1, *self._key_of_row(i))[0]

    def on(self, origin: str, destination: str, date: str) -> list[dict]:
        """Every flight on (origin, destination, date), in the source file's order."""
        o = self._city_code.get(origin)
        d = self._city_code.get(destination)
        t = self._date_code.get(date)
        if o is None or d is None or t is None:
            return []
        key = (o * self._n_cities + d) * self._n_dates + t
        pos = int(self._keys.searchsorted(np.int64(key)))
        if pos >= len(self._keys) or self._keys[pos] != key:
            return []
        return self._rows(int(self._bounds[pos]), int(self._bounds[pos + 1]), origin, destination, date)

    def by_number(self, number: str) -> dict | None:
        """The first row with this flight number, or None."""
        if self._number_text is not None:
            i = self._number_lookup.get(number)
            return None if i is None else self.row(i)
        code = self._number_code(number)
        if code is None:
            return None
        # search with the array's own dtype: a Python int would make numpy cast the whole array per call
        pos = int(self._number_sorted.searchsorted(self._number_sorted.dtype.type(code)))
        if pos >= len(self._number_sorted) or self._number_sorted[pos] != code:
            return None
        return self.row(int(self._number_rows[pos]))

    @property
    def dates(self) -> list[str]:
        """Every flight date, sorted."""
        return self._sorted_dates

    def nbytes(self) -> int:
        """Memory held by the numpy columns and indexes."""
        arrays = [self._keys, self._bounds, self._price, self._distance, self._dep, self._arr, self._elapsed]
        if self._number_text is None:
            arrays += [self._number_codes, self._number_sorted, self._number_rows]
        return int(sum(a.nbytes for a in arrays))


@dataclass(frozen=True)
class World:
    """The sandbox's database with every lookup an index hit. Build with `World.load` or `World.from_frames`."""

    flights: FlightIndex
    _accommodations: dict[str, list[dict]]
    _restaurants: dict[str, list[dict]]
    _attractions: dict[str, list[dict]]
    _distance: dict[tuple[str, str], dict]
    _cities_by_state: dict[str, list[str]]
    _state_of: dict[str, str]
    holdout_states: list[str] = field(default_factory=list)
    manifest: Mapping[str, Any] | None = None

    @classmethod
    def from_frames(
        cls,
        flights: Any,
        accommodations: Any,
        restaurants: Any,
        attractions: Any,
        distance: Any,
        cities: Any,
        holdout_states: list[str] | tuple[str, ...] = (),
        manifest: Mapping[str, Any] | None = None,
    ) -> "World":
        """Build a world from tables (pandas DataFrames or pyarrow Tables with the official column names;
        `flights` may also be a prebuilt `FlightIndex`)."""
        tables = {
            "accommodations": (_to_table(accommodations), ACCOMMODATION_COLUMNS),
            "restaurants": (_to_table(restaurants), RESTAURANT_COLUMNS),
            "attractions": (_to_table(attractions), ATTRACTION_COLUMNS),
            "distance": (_to_table(distance), DISTANCE_COLUMNS),
            "cities": (_to_table(cities), CITY_COLUMNS),
        }
        for name, (table, columns) in tables.items():
            _require_columns(table, name, columns)
        distance_index: dict[tuple[str, str], dict] = {}
        dist = tables["distance"][0].select(list(DISTANCE_COLUMNS)).to_pydict()
        for o, d, dur, km in zip(dist["origin"], dist["destination"], dist["duration"], dist["distance"]):
            if (o, d) not in distance_index:  # the official tool uses the first matching row
                distance_index[(o, d)] = distance_entry(o, d, dur, km)
        cities_by_state: dict[str, list[str]] = {}
        state_of: dict[str, str] = {}
        for row in _rows(tables["cities"][0].select(list(CITY_COLUMNS))):
            if row["City"] in state_of:
                continue
            state_of[row["City"]] = row["State"]
            cities_by_state.setdefault(row["State"], []).append(row["City"])
        return cls(
            flights=flights if isinstance(flights, FlightIndex) else FlightIndex(_to_table(flights)),
            _accommodations=_group_rows(_rows(tables["accommodations"][0]), "city"),
            _restaurants=_group_rows(_rows(tables["restaurants"][0]), "City"),
            _attractions=_group_rows(_rows(tables["attractions"][0]), "City"),
            _distance=distance_index,
            _cities_by_state=cities_by_state,
            _state_of=state_of,
            holdout_states=list(holdout_states),
            manifest=manifest,
        )

    @classmethod
    def load(cls, directory: str | Path) -> "World":
        """Read a world directory (one Parquet file per table + manifest.json)."""
        directory = Path(directory)
        if not directory.is_dir():
            raise WorldError(f"world directory {directory} does not exist (run `star world build` or `star world synth`)")
        missing = [t for t in TABLES if not (directory / f"{t}.parquet").exists()]
        if missing:
            raise WorldError(f"world directory {directory} lacks {[m + '.parquet' for m in missing]}; re-create it")
        manifest_path = directory / "manifest.json"
        manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
        for table in TABLES:
            problems = schema_problems(pq.read_schema(directory / f"{table}.parquet"), table)
            if problems:
                raise WorldError(
                    f"{directory / (table + '.parquet')}: {'; '.join(problems)}. This world was written by an older "
                    f"importer or another tool; rebuild it: {rebuild_command(directory, manifest)}")
        frames = {t: pq.read_table(directory / f"{t}.parquet") for t in TABLES if t != "flights"}
        frames["flights"] = FlightIndex.from_parquet(directory / "flights.parquet")
        return cls.from_frames(**frames, holdout_states=manifest.get("holdout_states", []), manifest=manifest)

    # --- lookups (all index hits) -------------------------------------------------------------------------
    def flights_on(self, origin: str, destination: str, date: str) -> list[dict]:
        """Every flight from `origin` to `destination` on `date` (YYYY-MM-DD)."""
        return self.flights.on(origin, destination, date)

    def flight(self, number: str) -> dict | None:
        """The flight with this number, or None."""
        return self.flights.by_number(number)

    def distance(self, origin: str, destination: str) -> dict | None:
        """The route between two cities (first row of the table), or None when the pair is absent."""
        return self._distance.get((origin, destination))

    def accommodations_in(self, city: str) -> list[dict]:
        return self._accommodations.get(city, [])

    def restaurants_in(self, city: str) -> list[dict]:
        return self._restaurants.get(city, [])

    def attractions_in(self, city: str) -> list[dict]:
        return self._attractions.get(city, [])

    def cities_in(self, state: str) -> list[str]:
        return list(self._cities_by_state.get(state, []))

    def state_of(self, city: str) -> str | None:
        return self._state_of.get(city)

    @property
    def cities(self) -> list[str]:
        return list(self._state_of)

    @property
    def states(self) -> list[str]:
        return list(self._cities_by_state)

    @property
    def dates(self) -> list[str]:
        """The dates that have at least one flight, sorted."""
        return list(self.flights.dates)

    @property
    def prompt_style(self) -> str:
        """The system prompt style of episodes over this world ("full" unless the manifest says otherwise)."""
        return str((self.manifest or {}).get("prompt_style") or "full")



def table_sha256(path: str | Path) -> str:
    """sha256 of a Parquet file's content: column names, then each column's values and nulls.

    Hashing the data rather than the file bytes makes the digest independent of writer metadata and chunking.
    """
    table = pq.read_table(path)
    digest = hashlib.sha256(json.dumps(table.schema.names).encode())
    for column in table.columns:
        array = column.combine_chunks() if column.num_chunks else pa.array([], type=column.type)
        for part in _column_bytes(array):
            digest.update(part)
    return digest.hexdigest()


def _column_bytes(array: pa.Array) -> list[bytes]:
    """A stable byte rendering of one column: null mask, then values (string offsets rebased to zero)."""
    if pa.types.is_dictionary(array.type):
        array = array.cast(array.type.value_type)
    nulls = pc.is_null(array).to_numpy(zero_copy_only=False).tobytes()
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        array = array.cast(pa.large_string())
        offsets = np.frombuffer(array.buffers()[1], dtype=np.int64)[array.offset: array.offset + len(array) + 1]
        data = array.buffers()[2]
        body = b"" if data is None or len(offsets) == 0 else data.to_pybytes()[offsets[0]: offsets[-1]]
        rebased = (offsets - offsets[0]).tobytes() if len(offsets) else b""
        return [nulls, rebased, body]
    return [nulls, array.to_numpy(zero_copy_only=False).tobytes()]


def write_world(
    frames: Mapping[str, Any],
    out_dir: str | Path,
    source: str,
    params: Mapping[str, Any] | None = None,
    holdout_states: list[str] | tuple[str, ...] = (),
    prompt_style: str = "full",
) -> dict:
    """Write one Parquet file per table plus manifest.json; returns the manifest.

    `prompt_style` ("full" | "compact") is the system prompt every episode over this world uses (`TravelEnv`)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    missing = [t for t in TABLES if t not in frames]
    if missing:
        raise WorldError(f"cannot write a world without the tables {missing}")
    tables = {}
    for name in TABLES:
        table = _to_table(frames[name])
        path = out_dir / f"{name}.parquet"
        pq.write_table(table, path)
        tables[name] = {"rows": table.num_rows, "sha256": table_sha256(path)}
    manifest = {
        "source": source,
        "params": dict(params) if params is not None else None,
        "holdout_states": list(holdout_states),
        "prompt_style": prompt_style,
        "tables": tables,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
