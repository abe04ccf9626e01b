"""The path a user's files take: the official database layout, a flights CSV in the official format, `star world
import`, then the 45 human gold plans through the evaluator and every gold flight through the flight tool.

The flights CSV is written from the flight rows quoted in the benchmark's reference information, in the format of
`database/flights/clean_Flights_2022.csv` (an unnamed index column, dates and times as text), so the importer reads
exactly what it reads on the real 3.8 M-row file.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from components.cli import main
from components.travel.evaluate import evaluate_plan
from components.travel.plans import parse_plan
from components.travel.tasks import load_queries
from components.travel.tools import call_tool
from components.travel.world import World, WorldError

QUERIES = Path(__file__).resolve().parents[1] / "fixtures" / "train_queries.jsonl"
FLIGHT = re.compile(r"Flight Number:\s*(F\d+)")
# Strict mode's one verdict against a gold plan (test_evaluator_gold.py: plan 41's attractions lie outside its city).
STRICT_GOLD_DEFECTS = {41}


@pytest.fixture(scope="module")
def official_dir(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference copy laid out as the official database (`database/<table>/<file>`), flights CSV included."""
    out = tmp_path_factory.mktemp("official") / "travelplanner"
    assert main(["world", "layout-reference", "--reference", str(shared_data), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def imported(official_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("imported") / "world"
    assert main(["world", "import", "--source", str(official_dir), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def gold(shared_data: Path) -> list[tuple]:
    queries = load_queries(QUERIES)
    lines = (shared_data / "fixtures" / "train_gold_plans_messages.jsonl").read_text().splitlines()
    return [(query, parse_plan(json.loads(line)["messages"][2]["content"])[0]) for query, line in zip(queries, lines)]


def test_the_layout_is_the_official_one(official_dir):
    flights = official_dir / "database" / "flights" / "clean_Flights_2022.csv"
    header, first = flights.read_text().splitlines()[:2]
    assert header == (",Flight Number,Price,DepTime,ArrTime,ActualElapsedTime,FlightDate,OriginCityName,"
                      "DestCityName,Distance")
    assert re.fullmatch(r"0,F\d+,\d+,\d\d:\d\d,\d\d:\d\d,[^,]+,2022-\d\d-\d\d,[^,]+,[^,]+,\d+\.\d+", first)
    for table in ("accommodations/clean_accommodations_2022.csv", "restaurants/clean_restaurant_2022.csv",
                  "attractions/attractions.csv", "googleDistanceMatrix/distance.csv",
                  "background/citySet_with_states.txt"):
        assert (official_dir / "database" / table).is_file()


def test_imported_flights_keep_the_files_text(imported):
    schema = pq.read_schema(imported / "flights.parquet")
    for column in ("FlightDate", "DepTime", "ArrTime", "ActualElapsedTime", "Flight Number"):
        assert str(schema.field(column).type) == "string", column
    assert str(schema.field("Price").type) == "int64" and str(schema.field("Distance").type) == "double"


def test_every_gold_plan_passes_official_and_strict_as_on_the_reference_world(imported, gold, real_world):
    world = World.load(imported)
    official = {q.idx for q, plan in gold if not evaluate_plan(world, q, plan, "official").final_pass}
    strict = {q.idx for q, plan in gold if not evaluate_plan(world, q, plan, "strict").final_pass}
    assert len(gold) == 45 and official == set()
    assert strict == STRICT_GOLD_DEFECTS
    # the same verdicts, check by check, as on the world built straight from the reference rows
    for query, plan in gold:
        for mode in ("official", "strict"):
            ours, reference = evaluate_plan(world, query, plan, mode), evaluate_plan(real_world, query, plan, mode)
            assert {k: r.passed for k, r in {**ours.commonsense, **ours.hard}.items()} == \
                   {k: r.passed for k, r in {**reference.commonsense, **reference.hard}.items()}, (query.idx, mode)


def test_the_flight_tool_finds_every_gold_flight_with_its_reference_row(imported, gold, shared_data):
    world = World.load(imported)
    reference = {}
    for line in (shared_data / "fixtures" / "train_ref_info.jsonl").read_text().splitlines():
        for description, rows in json.loads(line).items():
            if description.startswith("Flight from") and isinstance(rows, list):
                reference.update({row["Flight Number"]: row for row in rows})
    flown = [(query, number) for query, plan in gold for day in plan
             for number in FLIGHT.findall(str(day.get("transportation", "")))]
    assert len(flown) == 33  # flights in 45 gold plans
    for query, number in flown:
        row = reference[number]
        found = call_tool(world, "SearchFlight", {"departure": row["OriginCityName"],
                                                  "destination": row["DestCityName"], "date": row["FlightDate"]})
        assert found.ok, (query.idx, number, found.text)
        assert row in found.rows, (query.idx, number)
        assert world.flight(number) == row


def test_a_world_written_with_typed_dates_is_refused_with_the_command_that_rebuilds_it(imported, tmp_path):
    old = tmp_path / "old_world"
    old.mkdir()
    for path in imported.iterdir():
        (old / path.name).write_bytes(path.read_bytes())
    flights = pd.read_parquet(imported / "flights.parquet")
    flights["FlightDate"] = pd.to_datetime(flights["FlightDate"]).dt.date  # what pyarrow's CSV type inference made
    flights.to_parquet(old / "flights.parquet")
    with pytest.raises(WorldError, match=r"FlightDate.*date32.*star world import --source .*travelplanner"):
        World.load(old)


def test_a_column_that_is_not_the_official_type_names_the_file_and_column(official_dir, tmp_path, capsys):
    bad = tmp_path / "travelplanner"
    shutil.copytree(official_dir, bad)
    flights = bad / "database" / "flights" / "clean_Flights_2022.csv"
    header, first, *rest = flights.read_text().splitlines()
    cells = first.split(",")
    cells[2] = "cheap"  # Price
    flights.write_text("\n".join([header, ",".join(cells), *rest]) + "\n")
    assert main(["world", "import", "--source", str(bad), "--out", str(tmp_path / "w")]) == 1
    error = capsys.readouterr().err
    assert "clean_Flights_2022.csv" in error and "'Price'" in error and "cheap" in error
    assert not (tmp_path / "w").exists()


# ---- the other values a real run reads from these files, each as the import leaves them ----

def test_every_house_rule_and_room_type_is_one_the_queries_can_name(imported):
    from components.travel.checks import ROOM_TYPE_OF
    from components.travel.tasks import HOUSE_RULES

    rooms = pd.read_parquet(imported / "accommodations.parquet")
    rules = {rule.strip() for text in rooms["house_rules"] for rule in text.split("&")}
    assert rules == {f"No {rule}" for rule in HOUSE_RULES}  # what the room-rule checks look for
    assert set(rooms["room type"]) == set(ROOM_TYPE_OF.values())


def test_every_distance_row_reads_as_minutes_and_kilometres_or_is_invalid(imported):
    from components.travel.world import distance_entry

    table = pd.read_parquet(imported / "distance.parquet")
    assert "cost" not in table.columns  # always empty in the file: the tools compute the cost from the distance
    entries = [distance_entry(*row) for row in table[["origin", "destination", "duration", "distance"]].itertuples(
        index=False)]
    valid = [e for e in entries if e["valid"]]
    assert len(valid) > 10_000
    assert all(e["minutes"] > 0 and e["km"] > 0 for e in valid)
    multi_day = [e for e in entries if e["duration"] and "day" in e["duration"]]
    assert multi_day and not any(e["valid"] for e in multi_day)  # the official tool's "no valid information"
    assert all(not e["valid"] for e in entries if e["duration"] is None)


def test_the_gold_plans_fly_on_their_querys_dates_at_the_listed_prices(imported, gold):
    world = World.load(imported)
    for query, plan in gold:
        assert all(re.fullmatch(r"2022-\d\d-\d\d", day) for day in query.date) and isinstance(query.budget, int)
        for number, day in ((n, d) for d, entry in zip(query.date, plan)
                            for n in FLIGHT.findall(str(entry.get("transportation", "")))):
            row = world.flight(number)
            assert row["FlightDate"] == day and isinstance(row["Price"], int), (query.idx, number)


def test_queries_synthesized_on_the_imported_database_name_its_dates_and_cities(imported, tmp_path, monkeypatch):
    from components.travel.tasks import load_queries

    monkeypatch.chdir(tmp_path)  # the stage's MLflow store and metrics land here
    params = tmp_path / "queries.yaml"
    params.write_text("queries:\n  days: [3, 5, 7]\n  sizes: {sft: 6, rl: 3, val: 3}\n")
    assert main(["queries", "--params", str(params), "--world", str(imported), "--out", str(tmp_path / "q"),
                 "--metrics", str(tmp_path / "queries.json")]) == 0
    world = World.load(imported)
    queries = [q for split in ("sft", "rl", "val") for q in load_queries(tmp_path / "q" / f"{split}.jsonl")]
    assert {q.days for q in queries} <= {3, 5, 7} and len(queries) == 12
    for query in queries:
        assert world.state_of(query.org) is not None and query.budget > 0
        assert all(re.fullmatch(r"2022-\d\d-\d\d", day) for day in query.date)
