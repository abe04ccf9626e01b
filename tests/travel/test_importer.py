"""Importing the real database: both layouts, the official load rules, flights from reference information."""
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from components.travel.importer import DatabaseNotFoundError, flights_from_ref_info, import_database
from components.travel.world import World, table_sha256


def test_real_import_applies_the_official_load_rules(real_world_dir, shared_data):
    manifest = json.loads((real_world_dir / "manifest.json").read_text())
    rows = {name: info["rows"] for name, info in manifest["tables"].items()}
    raw_distance = pd.read_csv(shared_data / "database" / "distance.csv")
    assert rows["accommodations"] == 4285  # 5,047 minus rows with an empty field
    assert rows["restaurants"] == 9551 and rows["attractions"] == 5302 and rows["cities"] == 312
    assert rows["distance"] == len(raw_distance.drop_duplicates(["origin", "destination"]))
    assert "Unnamed: 0" not in pd.read_parquet(real_world_dir / "accommodations.parquet").columns
    for name, info in manifest["tables"].items():
        assert info["sha256"] == table_sha256(real_world_dir / f"{name}.parquet")


def test_first_distance_row_wins(real_world, shared_data):
    raw = pd.read_csv(shared_data / "database" / "distance.csv")
    pairs = raw.groupby(["origin", "destination"], sort=False)
    conflicting = pairs["distance"].nunique(dropna=False)
    conflicting = conflicting[conflicting > 1]
    assert len(conflicting) > 0, "the real table has duplicate pairs with different values"
    first = pairs.head(1).set_index(["origin", "destination"]).loc[conflicting.index]
    for (origin, destination), row in first.head(50).iterrows():
        expected = None if pd.isna(row.distance) else row.distance
        assert real_world.distance(origin, destination)["distance"] == expected


def test_flat_and_official_layouts_import_the_same_tables(shared_data, tmp_path):
    official = tmp_path / "official" / "database"
    folders = {"clean_accommodations_2022.csv": "accommodations", "clean_restaurant_2022.csv": "restaurants",
               "attractions.csv": "attractions", "distance.csv": "googleDistanceMatrix",
               "citySet_with_states.txt": "background"}
    for name, folder in folders.items():
        (official / folder).mkdir(parents=True, exist_ok=True)
        shutil.copy(shared_data / "database" / name, official / folder / name)
    a = import_database(tmp_path / "official", tmp_path / "a")
    b = import_database(shared_data, tmp_path / "b")  # flat: <source>/database/<file>.csv
    assert {k: v["sha256"] for k, v in a["tables"].items()} == {k: v["sha256"] for k, v in b["tables"].items()}
    assert a["tables"]["flights"]["rows"] == 0
    assert World.load(tmp_path / "a").flights_on("Rockford", "Dallas", "2022-03-16") == []


def test_missing_flights_warn(shared_data, tmp_path, caplog):
    with caplog.at_level("WARNING"):
        import_database(shared_data / "database", tmp_path / "w")
    assert "no flights table" in caplog.text


def test_flights_from_ref_info_keeps_each_flight_once(shared_data):
    flights = flights_from_ref_info(shared_data / "fixtures" / "train_ref_info.jsonl")
    assert list(flights.columns) == ["Flight Number", "Price", "DepTime", "ArrTime", "ActualElapsedTime",
                                     "FlightDate", "OriginCityName", "DestCityName", "Distance"]
    assert not flights.duplicated(["Flight Number", "FlightDate"]).any()
    assert (flights["Flight Number"] == "F3573659").sum() == 1


def test_a_folder_without_a_database_says_what_is_missing(tmp_path):
    with pytest.raises(DatabaseNotFoundError, match="clean_accommodations_2022.csv"):
        import_database(tmp_path, tmp_path / "out")


def test_a_missing_database_says_where_the_official_one_is_published(tmp_path, monkeypatch, capsys):
    from components.cli import main

    monkeypatch.chdir(tmp_path)
    Path("params").mkdir()
    Path("params/world.yaml").write_text("world:\n  source: data/travelplanner\n  prompt_style: full\n")
    assert main(["world", "build", "--params", "params/world.yaml", "--out", "data/world"]) == 1
    error = capsys.readouterr().err
    assert "world.source='data/travelplanner'" in error
    assert "github.com/OSU-NLP-Group/TravelPlanner" in error
    assert "data/travelplanner/database/flights/clean_Flights_2022.csv" in error and "docs/operations.md" in error
    assert not Path("data/world").exists()
