"""The synthetic world: seeded, official schema, realistic structure, unseen names for held-out states."""
import itertools

import pytest

from components.params import ParamsError, parse_section
from components.travel.synthetic import (
    CUISINES,
    WorldParams,
    format_drive_duration,
    synthesize_world,
    tiny_world_params,
)
from components.travel.world import World


def test_the_same_seed_gives_the_same_world_and_another_seed_another():
    a, _ = synthesize_world(tiny_world_params())
    b, _ = synthesize_world(tiny_world_params())
    c, _ = synthesize_world(tiny_world_params(seed=1))
    assert all(a[name].equals(b[name]) for name in a)
    assert not a["cities"].equals(c["cities"])


def test_the_tiny_world_is_small_with_short_flight_ids(tiny_world):
    assert len(tiny_world.states) == 6 and len(tiny_world.cities) == 24
    assert all(len(tiny_world.cities_in(s)) >= 3 for s in tiny_world.states)
    assert tiny_world.dates[0] == "2022-03-01" and tiny_world.dates[-1] <= "2022-03-31"
    some = next(f for a, b in itertools.permutations(tiny_world.cities, 2)
                for f in tiny_world.flights_on(a, b, "2022-03-10"))
    assert len(some["Flight Number"]) == 5 and some["Flight Number"].startswith("F")
    assert tiny_world.flight(some["Flight Number"]) == some


def test_the_world_has_the_structure_an_agent_must_cope_with(tiny_world):
    pairs = list(itertools.permutations(tiny_world.cities, 2))
    dates = tiny_world.dates
    has_flights = {(a, b) for a, b in pairs if any(tiny_world.flights_on(a, b, d) for d in dates)}
    roads = {(a, b): tiny_world.distance(a, b) for a, b in pairs if tiny_world.distance(a, b)}
    assert any(p not in has_flights and p not in roads for p in pairs)  # unreachable pairs
    assert any(p not in has_flights and r["valid"] for p, r in roads.items())  # drive-only
    assert any("day" in r["duration"] and not r["valid"] for r in roads.values())  # multi-day drives
    assert any(not tiny_world.attractions_in(c) for c in tiny_world.cities)
    listings = [row for c in tiny_world.cities for row in tiny_world.accommodations_in(c)]
    assert any(row["minimum nights"] >= 7 for row in listings)
    for city in tiny_world.cities:
        served = {x for r in tiny_world.restaurants_in(city) for x in r["Cuisines"].split(", ")}
        assert served < set(CUISINES)  # every city lacks some cuisine


def test_every_name_is_used_in_one_city_only(tiny_world):
    owner = {}
    for city in tiny_world.cities:
        names = ([r["NAME"] for r in tiny_world.accommodations_in(city)]
                 + [r["Name"] for r in tiny_world.restaurants_in(city)]
                 + [r["Name"] for r in tiny_world.attractions_in(city)])
        for name in names:
            word = name.split()[0]
            assert owner.setdefault(word, city) == city, f"{word} used in {owner[word]} and {city}"
            assert word not in tiny_world.cities and word not in tiny_world.states


def test_held_out_states_are_recorded(tiny_world):
    assert len(tiny_world.holdout_states) == 1 and tiny_world.holdout_states[0] in tiny_world.states


def test_a_dense_flight_table_keeps_unique_numbers_and_finds_each_flight():
    params = WorldParams(states=10, cities_per_state=(5, 5), num_dates=30, flight_route_fraction=0.8,
                         flights_per_route_day=(2, 4), holdout_states=0)
    flights = synthesize_world(params)[0]["flights"]
    numbers = flights["Flight Number"].to_pylist()
    assert len(numbers) > 50_000 and len(set(numbers)) == len(numbers)
    world = World.from_frames(**synthesize_world(params)[0])
    for i in (0, 12345, len(numbers) - 1):
        row = world.flight(numbers[i])
        assert row["Flight Number"] == numbers[i]
        assert row in world.flights_on(row["OriginCityName"], row["DestCityName"], row["FlightDate"])


@pytest.mark.parametrize("text, minutes", [("45 mins", 45), ("1 hour 5 mins", 65), ("10 hours 55 mins", 655),
                                           ("1 day 2 hours", 1560), ("2 days 0 hours", 2880)])
def test_drive_durations_read_like_the_official_table(text, minutes):
    assert format_drive_duration(minutes) == text


def test_params_errors_name_the_key():
    with pytest.raises(ParamsError, match="world.cities_per_state"):
        parse_section({"world": {"cities_per_state": [2, 4]}}, "world", WorldParams)
    with pytest.raises(ParamsError, match="world.flight_price"):
        parse_section({"world": {"flight_price": [500, 100]}}, "world", WorldParams)
    with pytest.raises(ParamsError, match="world.citys"):
        parse_section({"world": {"citys": 3}}, "world", WorldParams)


def test_too_many_flights_for_the_id_digits_is_a_clear_error():
    from components.errors import UserError

    with pytest.raises(UserError, match="flight_id_digits"):
        synthesize_world(tiny_world_params(flight_id_digits=2))


def test_star_world_build_then_star_tool(tmp_path, capsys):
    import json as json_

    from components.cli import main

    params = tmp_path / "world.yaml"
    params.write_text("world:\n  source: synthetic\n  seed: 3\n  states: 3\n  holdout_states: 0\n"
                      "  flight_id_digits: 5\n")
    assert main(["world", "build", "--params", str(params), "--out", str(tmp_path / "w")]) == 0
    manifest = json_.loads((tmp_path / "w" / "manifest.json").read_text())
    assert manifest["source"] == "synthetic" and manifest["params"]["seed"] == 3
    state = World.load(tmp_path / "w").states[0]
    capsys.readouterr()
    assert main(["tool", "--world", str(tmp_path / "w"), "SearchCity", json_.dumps({"state": state})]) == 0
    assert capsys.readouterr().out.startswith(f"Cities in {state} (")
    assert main(["tool", "--world", str(tmp_path / "w"), "SearchCity", "{not json"]) == 1
    assert "arguments must be a JSON object" in capsys.readouterr().err


def test_star_world_build_imports_a_database_path(tmp_path, shared_data):
    from components.cli import main

    params = tmp_path / "world.yaml"
    params.write_text(f"world:\n  source: {shared_data}\n"
                      f"  flights_from_ref_info: {shared_data / 'fixtures' / 'train_ref_info.jsonl'}\n")
    assert main(["world", "build", "--params", str(params), "--out", str(tmp_path / "w")]) == 0
    world = World.load(tmp_path / "w")
    assert len(world.cities) == 312 and world.flight("F3573659")["DestCityName"] == "Rockford"
