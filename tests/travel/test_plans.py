"""Plan parsing: the forms plans arrive in (JSON, Python literals, prose, fences) and the field grammars."""
from __future__ import annotations

import json

import pytest

from components.travel.plans import (
    current_cities,
    official_attraction_items,
    official_name_city,
    parse_plan,
    parse_transport,
    split_attractions,
    split_name_city,
    strip_cost_suffix,
)

DAY = {"days": 1, "current_city": "from Boston to Springfield", "transportation": "-", "breakfast": "-",
       "attraction": "Zoo, Springfield;", "lunch": "Pizza Place, Springfield", "dinner": "-",
       "accommodation": "Party House, Springfield"}


def test_json_text_and_python_literal_parse_to_the_same_plan():
    from_json, error = parse_plan(json.dumps([DAY]))
    from_literal, _ = parse_plan(repr([DAY, {}, {}]))  # gold plans: Python literals with trailing {} days
    assert error is None and from_json == from_literal == [DAY]


def test_prose_and_code_fences_around_the_plan_are_ignored():
    text = f"Here is your plan:\n```json\n{json.dumps([DAY])}\n```\nEnjoy the trip!"
    assert parse_plan(text) == ([DAY], None)
    assert parse_plan("Sure! " + json.dumps([DAY]) + " Have fun.") == ([DAY], None)


def test_day_key_becomes_days_and_lists_of_attractions_are_joined():
    day = {**DAY, "day": 2, "attraction": ["Zoo, Springfield", "Old Fort, Springfield"]}
    del day["days"]
    plan, _ = parse_plan([day])
    assert plan[0]["days"] == 2 and "day" not in plan[0]
    assert plan[0]["attraction"] == "Zoo, Springfield;Old Fort, Springfield;"


def test_cost_suffixes_are_removed_unless_asked_to_keep_them():
    day = {**DAY, "lunch": "Catfish Charlie's, Myrtle Beach; Cost: 14",
           "accommodation": "Adorable Prospect Heights 1 Bedroom, Myrtle Beach; Cost: 321 for 3 nights",
           "dinner": "Coconuts Fish Cafe, Dallas, Cost: 38",
           "attraction": "Texas Capitol, Austin;Bullock Museum, Austin, Cost: 26"}
    plan, _ = parse_plan([day])
    assert plan[0]["lunch"] == "Catfish Charlie's, Myrtle Beach"
    assert plan[0]["accommodation"] == "Adorable Prospect Heights 1 Bedroom, Myrtle Beach"
    assert plan[0]["dinner"] == "Coconuts Fish Cafe, Dallas"
    assert plan[0]["attraction"] == "Texas Capitol, Austin;Bullock Museum, Austin;"
    raw, _ = parse_plan([day], normalize=False)
    assert raw[0]["lunch"] == "Catfish Charlie's, Myrtle Beach; Cost: 14"
    assert strip_cost_suffix("Private Oasis (A), Savannah, Price: 1109") == "Private Oasis (A), Savannah"


@pytest.mark.parametrize("value, reason", [
    (None, "no plan given"),
    ("", "the plan is empty"),
    ("I could not find any flights.", "no JSON list"),
    ([{}, {}], "the plan has no days"),
    ([DAY, "day two: rest", DAY], "day 2 is a str"),
    ([{"total_cost": 300}], "the plan has no days"),
    (42, "got int"),
])
def test_unusable_plans_come_back_with_a_reason(value, reason):
    plan, error = parse_plan(value)
    assert plan is None and reason in error


def test_name_city_splits_at_the_last_comma():
    assert split_name_city("The Museum of Fine Arts, Houston, Houston(Texas)") == \
        ("The Museum of Fine Arts, Houston", "Houston")
    assert official_name_city("The Museum of Fine Arts, Houston, Houston(Texas)") == \
        ("The Museum of Fine Arts, Houston", "Houston")
    assert split_name_city("No comma here") is None
    assert official_name_city("No comma here") == ("-", "-")


def test_attraction_lists_strict_and_official_readings():
    assert split_attractions("A, X;B, X;") == ["A, X", "B, X"]
    assert split_attractions("A, X; B, X") == ["A, X", "B, X"]
    assert official_attraction_items("A, X;B, X") == ["A, X"]  # the official code drops the last item
    assert split_attractions("-") == []


def test_transportation_strings():
    flight = parse_transport("Flight Number: F3576711, from Las Vegas to Stockton, Departure Time: 06:01, "
                             "Arrival Time: 07:28")
    assert (flight.mode, flight.flight_number, flight.origin, flight.dest) == \
        ("flight", "F3576711", "Las Vegas", "Stockton")
    assert (flight.departure_time, flight.arrival_time) == ("06:01", "07:28")
    drive = parse_transport("Self-driving, from Dallas(Texas) to Houston(Texas), duration: 3 hours, cost: 18")
    assert (drive.mode, drive.origin, drive.dest) == ("self-driving", "Dallas", "Houston")
    assert parse_transport("Taxi, from A to B, duration: 1 hour").mode == "taxi"
    assert parse_transport("Driving, from A to B").mode == "unknown"
    assert parse_transport("-").mode == "none"


def test_current_city_forms():
    assert current_cities("Stockton") == ["Stockton"]
    assert current_cities("from San Antonio(Texas) to Seattle") == ["San Antonio", "Seattle"]
    assert current_cities("from Boston") is None


def test_a_trailing_cost_summary_is_not_a_day():
    plan, error = parse_plan([DAY, {"total_estimated_costs": {"flights": 867, "total": 5000}}])
    assert error is None and plan == [DAY]
