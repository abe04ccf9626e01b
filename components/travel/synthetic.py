"""A synthetic TravelPlanner world: the official tables, generated from a seed and size parameters.

Cities are points on a square map, clustered by state; road distances and flight distances follow from the
coordinates, so long drives take days (and are refused by the tools) while nearby pairs can be drive-only. Every
name (states, cities, listings, restaurants, attractions) is a word coined from syllables and used once in the
world, so a validation split drawn from held-out states sees cities and names that training never saw.
Flights are generated with vectorised numpy, so a 3.8 M-row table takes seconds.
"""
from __future__ import annotations

from datetime import date, timedelta
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import pyarrow as pa
from pydantic import Field, field_validator, model_validator

from components.errors import UserError
from components.params import Params
from components.syllables import NAME_SYLLABLES
from components.travel.world import write_world

CUISINES = (
    "Tea", "BBQ", "Seafood", "Cafe", "Desserts", "Pizza", "Fast Food", "Bakery", "Mediterranean", "French",
    "Mexican", "Chinese", "Indian", "Italian", "American",
)
HOUSE_RULES = ("No parties", "No smoking", "No children under 10", "No pets", "No visitors")
ROOM_TYPES = ("Entire home/apt", "Private room", "Shared room")

_LISTING_KINDS = ("Loft", "Cottage", "Suite", "Studio", "House", "Apartment", "Inn", "Villa", "Retreat", "Flat")
_RESTAURANT_KINDS = ("Kitchen", "Grill", "Bistro", "Cafe", "Diner", "Eatery", "Tavern", "Table", "Canteen")
_ATTRACTION_KINDS = ("Museum", "Park", "Gardens", "Gallery", "Tower", "Market", "Lake", "Theatre", "Bridge")

ROAD_FACTOR = 1.25  # road km per straight-line km
DRIVE_KMH = 85.0
MILES_PER_KM = 0.621371


class WorldParams(Params):
    """`params/world.yaml`, section `world`: where the world comes from and, if synthetic, its size."""

    source: str = "synthetic"  # "synthetic", or a path to a TravelPlanner database to import
    flights_from_ref_info: str | None = None  # when importing without the flights CSV
    prompt_style: Literal["full", "compact"] = "full"  # the episodes' system prompt (compact: the tiny preset)
    seed: int = 0
    states: int = Field(6, ge=1)
    cities_per_state: tuple[int, int] = (4, 4)
    holdout_states: int = Field(1, ge=0)  # states reserved for validation (their cities never appear in training queries)
    start_date: date = date(2022, 3, 1)
    num_dates: int = Field(31, ge=1)
    accommodations_per_city: tuple[int, int] = (3, 5)
    restaurants_per_city: tuple[int, int] = (4, 6)
    attractions_per_city: tuple[int, int] = (2, 4)
    no_attractions_fraction: float = 0.1
    cuisines_per_city: tuple[int, int] = (9, 13)  # cuisines served in a city (of 15); the rest are absent there
    long_stay_fraction: float = 0.15  # listings whose minimum stay is 7-30 nights
    map_km: float = 4500.0  # side of the square map
    state_spread_km: float = 350.0
    drive_fraction: float = 0.85  # city pairs with a distance row
    drive_only_fraction: float = 0.15  # pairs with a distance row but never a flight
    flight_route_fraction: float = 0.35  # remaining pairs with flights
    flight_day_fraction: float = 0.85  # dates on which a flight route operates
    flights_per_route_day: tuple[int, int] = (1, 3)
    flight_id_digits: int = Field(7, ge=1, le=9)  # "F" + k digits
    flight_price: tuple[int, int] = (60, 900)
    accommodation_price: tuple[int, int] = (40, 1200)
    restaurant_cost: tuple[int, int] = (10, 100)

    @field_validator(
        "cities_per_state", "accommodations_per_city", "restaurants_per_city", "attractions_per_city",
        "cuisines_per_city", "flights_per_route_day", "flight_price", "accommodation_price", "restaurant_cost",
    )
    @classmethod
    def _ordered_range(cls, value: tuple[int, int]) -> tuple[int, int]:
        low, high = value
        if low < 0 or low > high:
            raise ValueError(f"must be [low, high] with 0 <= low <= high, got {list(value)}")
        return value

    @field_validator(
        "no_attractions_fraction", "long_stay_fraction", "drive_fraction", "drive_only_fraction",
        "flight_route_fraction", "flight_day_fraction",
    )
    @classmethod
    def _fraction(cls, value: float) -> float:
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"must be a fraction in [0, 1], got {value}")
        return value

    @field_validator("cities_per_state")
    @classmethod
    def _three_cities(cls, value: tuple[int, int]) -> tuple[int, int]:
        if value[0] < 3:
            raise ValueError("must start at 3 or more: 5/7-day trips visit 3 cities of one state")
        return value

    @field_validator("cuisines_per_city")
    @classmethod
    def _cuisine_count(cls, value: tuple[int, int]) -> tuple[int, int]:
        if value[0] < 1 or value[1] > len(CUISINES):
            raise ValueError(f"must lie in [1, {len(CUISINES)}]")
        return value

    @model_validator(mode="after")
    def _holdout_fits(self) -> "WorldParams":
        if self.holdout_states >= self.states:
            raise ValueError(f"holdout_states={self.holdout_states} must be below states={self.states}: "
                             "training needs at least one state")
        return self


def tiny_world_params(**overrides) -> WorldParams:
    """The tiny preset's world (6 states x 4 cities, March 2022, short flight ids); what tests use."""
    return WorldParams(**{"flight_id_digits": 4, **overrides})


def coin_words(rng: np.random.Generator, count: int) -> list[str]:
    """`count` distinct capitalised words of 2-3 syllables."""
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < count:
        n = int(rng.integers(2, 4))
        word = "".join(NAME_SYLLABLES[i] for i in rng.integers(0, len(NAME_SYLLABLES), n)).capitalize()
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words


def _between(rng: np.random.Generator, bounds: tuple[int, int]) -> int:
    return int(rng.integers(bounds[0], bounds[1] + 1))


def format_drive_duration(minutes: int) -> str:
    """Render minutes like the official distance table: "1 day 3 hours", "10 hours 55 mins", "45 mins"."""
    days, rest = divmod(int(minutes), 24 * 60)
    hours, mins = divmod(rest, 60)
    if days:
        return f"{days} day{'s' if days > 1 else ''} {hours} hour{'s' if hours != 1 else ''}"
    if hours:
        return f"{hours} hour{'s' if hours != 1 else ''} {mins} mins"
    return f"{mins} mins"


def format_km(km: float) -> str:
    """Render kilometres like the official table: "1,433 km"."""
    return f"{int(round(km)):,} km"


def _layout(params: WorldParams, rng: np.random.Generator) -> tuple[pd.DataFrame, np.ndarray, list[str]]:
    """States, cities and their coordinates (km on the map)."""
    sizes = [_between(rng, params.cities_per_state) for _ in range(params.states)]
    names = coin_words(rng, params.states + sum(sizes))
    state_names, city_names = names[: params.states], names[params.states:]
    centres = rng.uniform(0, params.map_km, size=(params.states, 2))
    rows, coords = [], []
    k = 0
    for s, size in enumerate(sizes):
        for _ in range(size):
            rows.append({"City": city_names[k], "State": state_names[s]})
            coords.append(centres[s] + rng.normal(0, params.state_spread_km / 2, size=2))
            k += 1
    holdout = sorted(rng.choice(state_names, size=params.holdout_states, replace=False).tolist())
    return pd.DataFrame(rows, columns=["City", "State"]), np.array(coords), holdout


def _listings(params: WorldParams, rng: np.random.Generator, cities: pd.DataFrame, coords: np.ndarray) -> dict:
    """Accommodations, restaurants and attractions, each named with a word used nowhere else."""
    counts = [(_between(rng, params.accommodations_per_city), _between(rng, params.restaurants_per_city),
               0 if rng.random() < params.no_attractions_fraction else _between(rng, params.attractions_per_city))
              for _ in range(len(cities))]
    words = iter(coin_words(rng, sum(sum(c) for c in counts) + len(cities) * 4))
    taken = set(cities["City"]) | set(cities["State"])
    words = iter(w for w in words if w not in taken)
    accommodations, restaurants, attractions = [], [], []
    for c, (city, state) in enumerate(zip(cities["City"], cities["State"])):
        n_acc, n_rest, n_attr = counts[c]
        stays = [_accommodation(params, rng, next(words), city) for _ in range(n_acc)]
        accommodations += stays
        served = rng.choice(len(CUISINES), size=_between(rng, params.cuisines_per_city), replace=False)
        eateries = []
        for _ in range(n_rest):
            picks = rng.choice(served, size=min(len(served), int(rng.integers(1, 5))), replace=False)
            eateries.append({
                "Name": f"{next(words)} {_RESTAURANT_KINDS[rng.integers(len(_RESTAURANT_KINDS))]}",
                "Average Cost": int(rng.integers(params.restaurant_cost[0], params.restaurant_cost[1] + 1)),
                "Cuisines": ", ".join(CUISINES[i] for i in picks),
                "Aggregate Rating": round(float(rng.uniform(2.5, 5.0)), 1),
                "City": city,
            })
        restaurants += eateries
        for _ in range(n_attr):
            word = next(words)
            lat, lon = 25 + coords[c][1] / 200, -120 + coords[c][0] / 100
            attractions.append({
                "Name": f"{word} {_ATTRACTION_KINDS[rng.integers(len(_ATTRACTION_KINDS))]}",
                "Latitude": round(float(lat + rng.normal(0, 0.05)), 6),
                "Longitude": round(float(lon + rng.normal(0, 0.05)), 6),
                "Address": f"{int(rng.integers(1, 9999))} {word} St, {city}, {state[:2].upper()} "
                           f"{int(rng.integers(10000, 99999))}, USA",
                "Phone": f"({rng.integers(200, 999)}) {rng.integers(200, 999)}-{rng.integers(1000, 9999)}",
                "Website": f"https://www.{word.lower()}.example",
                "City": city,
            })
    return {
        "accommodations": pd.DataFrame(accommodations),
        "restaurants": pd.DataFrame(restaurants),
        "attractions": pd.DataFrame(attractions, columns=[
            "Name", "Latitude", "Longitude", "Address", "Phone", "Website", "City"]),
    }


def _accommodation(params: WorldParams, rng: np.random.Generator, word: str, city: str) -> dict:
    room = ROOM_TYPES[int(rng.choice(3, p=[0.5, 0.38, 0.12]))]
    low, high = params.accommodation_price
    scale = {"Entire home/apt": 1.0, "Private room": 0.55, "Shared room": 0.3}[room]
    price = max(low, int(rng.uniform(low, high) * scale))
    occupancy = {"Entire home/apt": (2, 10), "Private room": (1, 3), "Shared room": (1, 2)}[room]
    rules = rng.choice(len(HOUSE_RULES), size=int(rng.integers(1, 4)), replace=False)
    long_stay = rng.random() < params.long_stay_fraction
    nights = int(rng.integers(7, 31)) if long_stay else int(rng.choice([1, 1, 1, 2, 2, 3]))
    return {
        "NAME": f"{word} {_LISTING_KINDS[rng.integers(len(_LISTING_KINDS))]}",
        "price": float(price),
        "room type": room,
        "house_rules": " & ".join(HOUSE_RULES[i] for i in sorted(rules)),
        "minimum nights": float(nights),
        "maximum occupancy": int(rng.integers(occupancy[0], occupancy[1] + 1)),
        "review rate number": float(rng.integers(1, 6)),
        "city": city,
    }


def _pairs(params: WorldParams, rng: np.random.Generator, coords: np.ndarray) -> tuple:
    """Unordered city pairs: straight-line km, drive flag, flight flag (symmetric: both directions alike)."""
    n = len(coords)
    i, j = np.triu_indices(n, k=1)
    km = np.hypot(*(coords[i] - coords[j]).T)
    drive = rng.random(len(i)) < params.drive_fraction
    drive_only = drive & (rng.random(len(i)) < params.drive_only_fraction)
    flight = ~drive_only & (rng.random(len(i)) < params.flight_route_fraction)
    return i, j, km, drive, flight


def _distance_table(params: WorldParams, rng: np.random.Generator, names: list[str], pairs: tuple) -> pd.DataFrame:
    i, j, km, drive, _ = pairs
    rows = []
    for a, b, straight in zip(i[drive], j[drive], km[drive]):
        for origin, dest in ((a, b), (b, a)):  # each direction its own row, slightly different, as in the real data
            road = max(5.0, straight * ROAD_FACTOR * rng.uniform(0.98, 1.03))
            minutes = int(road / DRIVE_KMH * 60 * rng.uniform(0.95, 1.08)) + 5
            rows.append({"origin": names[origin], "destination": names[dest],
                         "duration": format_drive_duration(minutes), "distance": format_km(road)})
    return pd.DataFrame(rows, columns=["origin", "destination", "duration", "distance"])


def _clock_strings() -> np.ndarray:
    return np.array([f"{m // 60:02d}:{m % 60:02d}" for m in range(24 * 60)], dtype=object)


def _fixed_width_strings(codes: np.ndarray, prefix: str, digits: int) -> pa.Array:
    """"F" + zero-padded digits for every code, built as one Arrow buffer (fast for millions of rows)."""
    n = len(codes)
    width = len(prefix) + digits
    chars = np.empty((n, width), dtype=np.uint8)
    chars[:, : len(prefix)] = np.frombuffer(prefix.encode(), dtype=np.uint8)
    for position in range(digits):
        chars[:, len(prefix) + position] = (codes // 10 ** (digits - 1 - position)) % 10 + ord("0")
    offsets = pa.py_buffer((np.arange(n + 1, dtype=np.int32) * width).tobytes())
    return pa.StringArray.from_buffers(n, offsets, pa.py_buffer(chars.tobytes()))


def _flight_table(params: WorldParams, rng: np.random.Generator, names: list[str], pairs: tuple) -> pa.Table:
    """Every flight: routes x dates x 1..k flights, vectorised."""
    i, j, km, _, flight = pairs
    origin = np.r_[i[flight], j[flight]]
    dest = np.r_[j[flight], i[flight]]
    air_km = np.r_[km[flight], km[flight]]
    n_routes, n_dates = len(origin), params.num_dates
    low, high = params.flights_per_route_day
    counts = rng.integers(low, high + 1, size=(n_routes, n_dates))
    counts[rng.random((n_routes, n_dates)) >= params.flight_day_fraction] = 0
    cell = np.repeat(np.arange(n_routes * n_dates), counts.ravel())
    route, day = cell // n_dates, cell % n_dates
    n = len(cell)
    if n > 10**params.flight_id_digits:
        raise UserError(f"{n} flights do not fit in flight_id_digits={params.flight_id_digits}; raise it")

    miles = np.round(np.maximum(air_km[route], 30.0) * MILES_PER_KM)
    elapsed = (35 + miles / 8.0 + rng.integers(-10, 25, size=n)).astype(np.int64)
    departure = rng.integers(5 * 60, 22 * 60, size=n)
    arrival = (departure + elapsed) % (24 * 60)
    fp_low, fp_high = params.flight_price
    share = np.clip(miles / (params.map_km * 1.2 * MILES_PER_KM), 0, 1)
    price = (fp_low + (fp_high - fp_low) * (0.3 * share + 0.7 * rng.random(n))).astype(np.int64)

    # Unique numbers: an affine permutation of [0, 10**k) (multiplier coprime to 10).
    modulus = 10**params.flight_id_digits
    multiplier = int(rng.choice([3, 7, 9, 11, 13, 17, 19, 21, 23, 27])) % modulus or 1
    offset = int(rng.integers(0, modulus))
    numbers = (np.arange(n, dtype=np.int64) * multiplier + offset) % modulus

    dates = [(params.start_date + timedelta(days=d)).isoformat() for d in range(n_dates)]
    elapsed_values = np.array([f"{m // 60} hours {m % 60} minutes" for m in range(int(elapsed.max(initial=0)) + 1)],
                              dtype=object)
    clock = _clock_strings()

    def dictionary(codes: np.ndarray, values) -> pa.DictionaryArray:
        return pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32)), pa.array(list(values), pa.string()))

    return pa.table({
        "Flight Number": _fixed_width_strings(numbers, "F", params.flight_id_digits),
        "Price": pa.array(price),
        "DepTime": dictionary(departure, clock),
        "ArrTime": dictionary(arrival, clock),
        "ActualElapsedTime": dictionary(elapsed, elapsed_values),
        "FlightDate": dictionary(day, dates),
        "OriginCityName": dictionary(origin[route], names),
        "DestCityName": dictionary(dest[route], names),
        "Distance": pa.array(miles.astype(np.float64)),
    })


def synthesize_world(params: WorldParams) -> tuple[dict[str, pa.Table], list[str]]:
    """Generate every table from `params` (deterministic in `params.seed`): (frames, held-out state names)."""
    rng = np.random.default_rng(params.seed)
    cities, coords, holdout = _layout(params, rng)
    names = cities["City"].tolist()
    frames = _listings(params, rng, cities, coords)
    pairs = _pairs(params, rng, coords)
    frames["distance"] = _distance_table(params, rng, names, pairs)
    frames["cities"] = cities
    frames["flights"] = _flight_table(params, rng, names, pairs)
    tables = {name: frame if isinstance(frame, pa.Table) else pa.Table.from_pandas(frame, preserve_index=False)
              for name, frame in frames.items()}
    return tables, holdout


def write_synthetic_world(params: WorldParams, out_dir: str | Path) -> dict:
    """Generate a world and write it as a world directory; returns the manifest."""
    frames, holdout = synthesize_world(params)
    return write_world(frames, out_dir, source="synthetic", params=params.model_dump(mode="json"),
                       holdout_states=holdout, prompt_style=params.prompt_style)
