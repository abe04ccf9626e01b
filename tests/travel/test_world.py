"""World: indexes over the tables, the distance parsing rules, and loading a world directory."""
import json

import pandas as pd
import pytest

from components.travel.world import (
    World,
    WorldError,
    decode_flight_number,
    distance_entry,
    encode_flight_number,
    parse_km,
    parse_minutes,
)


def small_frames(**overrides):
    frames = {
        "flights": pd.DataFrame([
            {"Flight Number": "F0000002", "Price": 120, "DepTime": "08:00", "ArrTime": "09:30",
             "ActualElapsedTime": "1 hours 30 minutes", "FlightDate": "2022-03-02", "OriginCityName": "Ames",
             "DestCityName": "Boone", "Distance": 200.0},
            {"Flight Number": "F0000001", "Price": 100, "DepTime": "07:00", "ArrTime": "08:30",
             "ActualElapsedTime": "1 hours 30 minutes", "FlightDate": "2022-03-01", "OriginCityName": "Ames",
             "DestCityName": "Boone", "Distance": 200.0},
            {"Flight Number": "F0000003", "Price": 90, "DepTime": "18:00", "ArrTime": "19:30",
             "ActualElapsedTime": "1 hours 30 minutes", "FlightDate": "2022-03-02", "OriginCityName": "Ames",
             "DestCityName": "Boone", "Distance": 200.0},
            {"Flight Number": "F0000004", "Price": 95, "DepTime": "10:00", "ArrTime": "11:30",
             "ActualElapsedTime": "1 hours 30 minutes", "FlightDate": "2022-03-02", "OriginCityName": "Boone",
             "DestCityName": "Ames", "Distance": 200.0},
        ]),
        "accommodations": pd.DataFrame([
            {"NAME": "Quiet Loft", "price": 80.0, "room type": "Private room", "house_rules": "No pets",
             "minimum nights": 1.0, "maximum occupancy": 2, "review rate number": 4.0, "city": "Boone"},
        ]),
        "restaurants": pd.DataFrame([
            {"Name": "Corn Cafe", "Average Cost": 20, "Cuisines": "Cafe, Tea", "Aggregate Rating": 4.1, "City": "Boone"},
        ]),
        "attractions": pd.DataFrame([
            {"Name": "Big Barn", "Latitude": 42.0, "Longitude": -93.0, "Address": "1 Farm Rd", "Phone": "(515) 555-0100",
             "Website": "https://barn.example", "City": "Ames"},
        ]),
        "distance": pd.DataFrame([
            {"origin": "Ames", "destination": "Boone", "duration": "1 hour 5 mins", "distance": "1,433 km"},
            {"origin": "Ames", "destination": "Boone", "duration": "9 hours", "distance": "9 km"},
            {"origin": "Boone", "destination": "Ames", "duration": "1 day 2 hours", "distance": "2,900 km"},
        ]),
        "cities": pd.DataFrame([{"City": "Ames", "State": "Iowa"}, {"City": "Boone", "State": "Iowa"}]),
    }
    frames.update(overrides)
    return frames


def test_flights_on_returns_the_rows_of_one_route_and_date_in_file_order():
    world = World.from_frames(**small_frames())
    rows = world.flights_on("Ames", "Boone", "2022-03-02")
    assert [r["Flight Number"] for r in rows] == ["F0000002", "F0000003"]
    assert rows[0] == small_frames()["flights"].iloc[0].to_dict()
    assert world.flights_on("Boone", "Ames", "2022-03-01") == []
    assert world.flights_on("Nowhere", "Ames", "2022-03-02") == []


def test_flight_by_number_keeps_leading_zeros():
    world = World.from_frames(**small_frames())
    assert world.flight("F0000004")["OriginCityName"] == "Boone"
    assert world.flight("F4") is None
    assert world.flight("not a number") is None
    assert decode_flight_number(encode_flight_number("F0012")) == "F0012"
    assert encode_flight_number("F12") != encode_flight_number("F012")


def test_unusual_flight_numbers_fall_back_to_a_dict():
    flights = small_frames()["flights"].copy()
    flights.loc[0, "Flight Number"] = "AA 12"
    world = World.from_frames(**small_frames(flights=flights))
    assert world.flight("AA 12")["Price"] == 120
    assert world.flight("F0000001")["Price"] == 100


def test_distance_first_row_wins_and_multi_day_routes_are_invalid():
    world = World.from_frames(**small_frames())
    there = world.distance("Ames", "Boone")
    assert (there["km"], there["minutes"], there["valid"]) == (1433.0, 65, True)
    back = world.distance("Boone", "Ames")
    assert (back["minutes"], back["valid"]) == (26 * 60, False)
    assert world.distance("Ames", "Ames") is None


@pytest.mark.parametrize("text, minutes", [
    ("10 hours 55 mins", 655), ("1 hour 5 mins", 65), ("45 mins", 45), ("1 day 2 hours", 1560),
    ("2 days 1 hour", 2940), ("3 hours 1 min", 181), ("", None), (None, None), (float("nan"), None),
])
def test_parse_minutes(text, minutes):
    assert parse_minutes(text) == minutes


@pytest.mark.parametrize("text, km", [("1,433 km", 1433.0), ("12 km", 12.0), ("1.5 km", 1.5), (None, None), ("far", None)])
def test_parse_km(text, km):
    assert parse_km(text) == km


def test_empty_duration_is_not_a_valid_route():
    assert distance_entry("A", "B", float("nan"), float("nan"))["valid"] is False


def test_cities_and_states():
    world = World.from_frames(**small_frames())
    assert world.cities == ["Ames", "Boone"]
    assert world.states == ["Iowa"]
    assert world.cities_in("Iowa") == ["Ames", "Boone"]
    assert world.state_of("Boone") == "Iowa" and world.state_of("Paris") is None
    assert world.accommodations_in("Boone")[0]["NAME"] == "Quiet Loft"
    assert world.restaurants_in("Ames") == [] and world.attractions_in("Ames")[0]["Name"] == "Big Barn"


def test_missing_columns_name_the_table():
    bad = small_frames()["restaurants"].drop(columns=["Cuisines"])
    with pytest.raises(WorldError, match="restaurants.*Cuisines"):
        World.from_frames(**small_frames(restaurants=bad))


def test_load_reads_manifest_holdout_states(tiny_world_dir):
    manifest = json.loads((tiny_world_dir / "manifest.json").read_text())
    world = World.load(tiny_world_dir)
    assert world.holdout_states == manifest["holdout_states"] and len(world.holdout_states) == 1
    assert set(manifest["tables"]) == {"flights", "accommodations", "restaurants", "attractions", "distance", "cities"}


def test_load_missing_directory_says_how_to_fix(tmp_path):
    with pytest.raises(WorldError, match="star world"):
        World.load(tmp_path / "absent")


def test_real_world_has_no_holdout_states(real_world):
    assert real_world.holdout_states == []
    assert len(real_world.cities) == 312 and len(real_world.states) == 64
