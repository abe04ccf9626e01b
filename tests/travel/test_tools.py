"""The six tools: exact agreement with the official tools' outputs, clear errors, failure injection, and
`parse_observation` as the exact inverse of the rendering."""
import itertools
import json
import math
import random
import re

import pytest

from components.travel.tools import (
    COLUMNS,
    TOOL_NAMES,
    TOOL_SCHEMAS,
    call_tool,
    parse_observation,
    project_row,
)

REF_KEY = re.compile(
    r"(?P<kind>Attractions|Restaurants|Accommodations) in (?P<city>.+)"
    r"|Flight from (?P<f_org>.+) to (?P<f_dest>.+) on (?P<date>\d{4}-\d{2}-\d{2})"
    r"|(?P<drive>Self-driving|Taxi) from (?P<d_org>.+) to (?P<d_dest>.+)"
)
LISTING_TOOL = {"Attractions": "SearchAttraction", "Restaurants": "SearchRestaurant",
                "Accommodations": "SearchAccommodation"}


def same_value(a, b):
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def same_rows(ours, official):
    return len(ours) == len(official) and all(
        set(o) >= set(r) and all(same_value(o[k], r[k]) for k in r) for o, r in zip(ours, official))


def ref_entries(shared_data):
    with open(shared_data / "fixtures" / "train_ref_info.jsonl") as handle:
        for line_number, line in enumerate(handle, start=1):
            for description, content in json.loads(line).items():
                yield line_number, description, content


def test_tools_return_exactly_the_official_rows_for_all_45_reference_queries(real_world, shared_data):
    checked = {"listing": 0, "flight": 0, "no flight": 0, "drive": 0, "no drive": 0}
    for line_number, description, official in ref_entries(shared_data):
        match = REF_KEY.fullmatch(description)
        assert match, f"line {line_number}: unexpected reference entry {description!r}"
        where = f"line {line_number}, {description!r}"
        if match["kind"]:
            out = call_tool(real_world, LISTING_TOOL[match["kind"]], {"city": match["city"]})
            assert out.ok and same_rows(out.rows, official), where
            checked["listing"] += 1
        elif match["f_org"]:
            out = call_tool(real_world, "SearchFlight",
                            {"departure": match["f_org"], "destination": match["f_dest"], "date": match["date"]})
            if isinstance(official, list):
                assert out.ok and same_rows(out.rows, official), where
                checked["flight"] += 1
            else:
                assert not out.ok and out.text.startswith("There is no flight from"), where
                checked["no flight"] += 1
        else:
            mode = "driving" if match["drive"] == "Self-driving" else "taxi"
            out = call_tool(real_world, "GoogleDistanceMatrix",
                            {"departure": match["d_org"], "destination": match["d_dest"], "mode": mode})
            if official == "No valid information.":
                assert not out.ok and out.text.startswith("No valid information"), where
                checked["no drive"] += 1
            else:
                assert out.ok and out.text == official, where
                checked["drive"] += 1
    assert checked == {"listing": 270, "flight": 61, "no flight": 74, "drive": 254, "no drive": 16}


def test_a_flight_observation_is_one_short_line_per_flight(real_world):
    out = call_tool(real_world, "SearchFlight",
                    {"departure": "St. Petersburg", "destination": "Rockford", "date": "2022-03-16"})
    assert out.text.splitlines() == [
        "Flights from St. Petersburg to Rockford on 2022-03-16 (1):",
        "Flight Number\tPrice\tDepTime\tArrTime\tActualElapsedTime\tDistance",
        "F3573659\t474\t15:40\t17:04\t2 hours 24 minutes\t1049",
    ]


def test_driving_and_taxi_costs():
    from components.travel.tools import drive_cost

    assert drive_cost("driving", 1433.0) == 71
    assert drive_cost("taxi", 1433.0) == 1433
    assert drive_cost("driving", 19.9) == 0


@pytest.mark.parametrize("name, arguments, expected", [
    ("BookHotel", {"city": "Rockford"}, "unknown tool 'BookHotel'. Available tools: SearchFlight, "),
    ("SearchFlight", {"departure": "Rockford", "destination": "Dallas"}, "missing the argument 'date'"),
    ("SearchFlight", {"departure": "Rockford", "destination": "Dallas", "date": "March 16"}, "YYYY-MM-DD"),
    ("SearchFlight", {"departure": "Atlantis", "destination": "Dallas", "date": "2022-03-16"}, "Unknown city 'Atlantis'"),
    ("SearchFlight", {"departure": "Rockford", "destination": "Dallas", "date": "2022-03-16"}, "There is no flight"),
    ("SearchAccommodation", ["Rockford"], "must be a JSON object"),
    ("SearchAccommodation", {"city": "Rockford", "nights": "2"}, "has no argument 'nights'"),
    ("SearchAccommodation", {"city": 7}, "must be a non-empty string"),
    ("SearchRestaurant", {"city": "Gotham"}, "Unknown city 'Gotham'"),
    ("SearchCity", {"state": "Narnia"}, "Unknown state 'Narnia'"),
    ("GoogleDistanceMatrix", {"departure": "Rockford", "destination": "Dallas", "mode": "walking"}, "\"taxi\""),
])
def test_bad_calls_return_an_error_observation_that_says_what_to_do(real_world, name, arguments, expected):
    out = call_tool(real_world, name, arguments)
    assert not out.ok and out.rows == []
    assert expected in out.text


def test_a_city_without_attractions_says_so(tiny_world):
    empty = [c for c in tiny_world.cities if not tiny_world.attractions_in(c)]
    assert empty, "the tiny world should have a city without attractions"
    out = call_tool(tiny_world, "SearchAttraction", {"city": empty[0]})
    assert not out.ok and out.text == f"There is no attraction in {empty[0]}."


def test_multi_day_drives_are_refused(tiny_world):
    long_routes = [(a, b) for a, b in itertools.permutations(tiny_world.cities, 2)
                   if (d := tiny_world.distance(a, b)) and "day" in d["duration"]]
    assert long_routes, "the tiny world should have a multi-day drive"
    a, b = long_routes[0]
    out = call_tool(tiny_world, "GoogleDistanceMatrix", {"departure": a, "destination": b, "mode": "driving"})
    assert not out.ok and out.text.startswith("No valid information") and "day" in out.text


def test_whitespace_around_arguments_is_ignored(real_world):
    out = call_tool(real_world, "SearchCity", {"state": "  Illinois "})
    assert out.ok and {"City": "Rockford"} in out.rows


def test_failure_injection_is_seeded_and_transient(real_world):
    def outcomes(seed):
        rng = random.Random(seed)
        return [call_tool(real_world, "SearchCity", {"state": "Illinois"}, rng=rng, failure_rate=0.3).ok
                for _ in range(200)]

    first = outcomes(1)
    assert first == outcomes(1)
    assert 30 < first.count(False) < 90
    failed = call_tool(real_world, "SearchCity", {"state": "Illinois"}, rng=random.Random(0), failure_rate=1.0)
    assert "temporarily unavailable" in failed.text and "Retry" in failed.text
    assert call_tool(real_world, "SearchCity", {"state": "Illinois"}, failure_rate=1.0).ok  # no rng, no failures


def test_tool_schemas_name_the_agent_star_arguments():
    arguments = {s["function"]["name"]: s["function"]["parameters"]["required"] for s in TOOL_SCHEMAS}
    assert arguments == {
        "SearchFlight": ["departure", "destination", "date"],
        "GoogleDistanceMatrix": ["departure", "destination", "mode"],
        "SearchAccommodation": ["city"], "SearchRestaurant": ["city"], "SearchAttraction": ["city"],
        "SearchCity": ["state"],
    }
    assert list(arguments) == list(TOOL_NAMES)


def tiny_calls(world):
    """One call of every tool for every city, state and route (driving and taxi) of the tiny world."""
    for state in world.states:
        yield "SearchCity", {"state": state}
    for city in world.cities:
        for tool in ("SearchAccommodation", "SearchRestaurant", "SearchAttraction"):
            yield tool, {"city": city}
    for a, b in itertools.permutations(world.cities, 2):
        for mode in ("driving", "taxi"):
            yield "GoogleDistanceMatrix", {"departure": a, "destination": b, "mode": mode}
        yield "SearchFlight", {"departure": a, "destination": b, "date": world.dates[3]}


def test_parse_observation_inverts_every_tool_on_the_tiny_world(tiny_world):
    seen_ok = {name: 0 for name in TOOL_NAMES}
    for name, arguments in tiny_calls(tiny_world):
        out = call_tool(tiny_world, name, arguments)
        assert parse_observation(name, out.text) == [project_row(name, r) for r in out.rows], (name, arguments)
        seen_ok[name] += out.ok
    assert all(seen_ok.values()), seen_ok


def test_parse_observation_inverts_real_rows_with_pipes_and_commas(real_world):
    out = call_tool(real_world, "SearchAttraction", {"city": "San Diego"})
    rows = parse_observation("SearchAttraction", out.text)
    assert {"Name": "Mission Beach Boardwalk | Ocean Front Walk",
            "Address": "W Mission Bay Dr, San Diego, CA 92109, USA"} in rows
    assert rows == [project_row("SearchAttraction", r) for r in out.rows]


def test_parse_observation_of_an_error_is_empty():
    assert parse_observation("SearchFlight", "There is no flight from A to B on 2022-03-01.") == []
    assert parse_observation("GoogleDistanceMatrix", "No valid information.") == []
    assert parse_observation("NoSuchTool", "anything") == []


def test_tiny_world_observations_are_short(tiny_world):
    longest = max(len(call_tool(tiny_world, name, args).text) for name, args in tiny_calls(tiny_world))
    assert longest < 1200  # about 300 tokens
    assert set(COLUMNS) == set(TOOL_NAMES) - {"GoogleDistanceMatrix"}


def test_an_unknown_city_is_an_error_observation_that_says_how_to_find_the_right_name(tiny_world):
    out = call_tool(tiny_world, "SearchAccommodation", {"city": tiny_world.cities[0][:-1]})
    assert not out.ok and out.text.endswith("lists the cities of a state.")
