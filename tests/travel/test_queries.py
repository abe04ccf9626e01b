"""Query records: our JSONL, the official string-encoded rows and Agent-STAR's JSONL all load through one schema."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from components.errors import UserError
from components.travel.tasks import (
    Query,
    QueryError,
    dump_queries,
    load_agent_star_jsonl,
    load_any,
    level_stratified_prefix,
    load_official_csv,
    load_queries,
)

TRAIN_QUERIES = Path(__file__).resolve().parents[1] / "fixtures" / "train_queries.jsonl"

OFFICIAL_ROW = {
    "org": "Sacramento", "dest": "Atlanta", "days": "3", "visiting_city_number": "1",
    "date": "['2022-03-14', '2022-03-15', '2022-03-16']", "people_number": "2",
    "local_constraint": "{'house rule': 'parties', 'cuisine': None, 'room type': None, 'transportation': None}",
    "budget": "4700", "query": "Could you please arrange a 3-day trip for two ...", "level": "medium",
}


def test_the_training_queries_fixture_has_the_official_shape():
    queries = load_queries(TRAIN_QUERIES)
    assert len(queries) == 45
    assert [q.level for q in queries] == ["easy"] * 15 + ["medium"] * 15 + ["hard"] * 15
    assert all(len(q.date) == q.days and q.visiting_city_number == {3: 1, 5: 2, 7: 3}[q.days] for q in queries)
    first = queries[0]
    assert (first.org, first.dest, first.days, first.people_number, first.budget) == \
        ("St. Petersburg", "Rockford", 3, 1, 1700)
    assert first.date == ("2022-03-16", "2022-03-17", "2022-03-18")
    assert first.set_constraints() == []
    hard = queries[30]  # Houston -> Fayetteville, 2 people, kids, no self-driving, four cuisines
    assert hard.house_rule == "children under 10" and hard.transportation == "no self-driving"
    assert hard.cuisine == ["American", "Mediterranean", "French", "Chinese"]
    assert sum(len(q.set_constraints()) for q in queries) == 60  # official hard denominator 105 = 45 + 60


def test_each_fixture_query_restates_its_text():
    for query in load_queries(TRAIN_QUERIES):
        assert query.org in query.query
        assert f"${query.budget:,}" in query.query
        if query.days > 3:
            assert query.dest in query.query


def test_official_string_encoded_row_is_decoded():
    query = Query.from_dict(OFFICIAL_ROW, idx=7)
    assert query.idx == 7 and query.days == 3 and query.people_number == 2 and query.budget == 4700
    assert query.date == ("2022-03-14", "2022-03-15", "2022-03-16")
    assert query.local_constraint == {"house rule": "parties", "cuisine": None, "room type": None,
                                      "transportation": None}


def test_cuisine_lists_survive_the_string_encoding():
    row = dict(OFFICIAL_ROW, local_constraint="{'house rule': None, 'cuisine': ['Chinese', 'Indian'], "
                                              "'room type': 'not shared room', 'transportation': 'no flight'}")
    query = Query.from_dict(row, idx=0)
    assert query.cuisine == ["Chinese", "Indian"]
    assert query.set_constraints() == ["cuisine", "room type", "transportation"]


def test_round_trip_through_jsonl(tmp_path):
    queries = load_queries(TRAIN_QUERIES)
    path = dump_queries(queries, tmp_path / "q.jsonl")
    assert load_queries(path) == queries
    assert json.loads(path.read_text().splitlines()[0])["date"] == ["2022-03-16", "2022-03-17", "2022-03-18"]


def test_official_csv_and_agent_star_jsonl_load_through_the_same_schema(tmp_path):
    csv_path = tmp_path / "validation.csv"
    with csv_path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(OFFICIAL_ROW))
        writer.writeheader()
        writer.writerow(OFFICIAL_ROW)
    star_path = tmp_path / "agent_star.jsonl"
    star_path.write_text(json.dumps({**OFFICIAL_ROW, "days": 3, "budget": 4700}) + "\n")
    from_csv = load_official_csv(csv_path)[0]
    from_star = load_agent_star_jsonl(star_path)[0]
    assert from_csv == from_star == load_any(csv_path)[0]


@pytest.mark.parametrize("change, message", [
    ({"date": "['2022-03-14']"}, "'date' has 1 entries but 'days' is 3"),
    ({"budget": "a lot"}, "'budget' must be an integer"),
    ({"level": "extreme"}, "level 'extreme' is not one of"),
    ({"local_constraint": "{'house rule': 'loud music'}"}, "'house rule'] = 'loud music' is not one of"),
    ({"local_constraint": "{'wifi': True}"}, "unknown local_constraint key"),
    ({"org": None}, "lacks field(s) ['org']"),
])
def test_bad_records_say_what_is_wrong(change, message):
    with pytest.raises(QueryError, match=None) as info:
        Query.from_dict({**OFFICIAL_ROW, **change}, idx=1)
    assert message in str(info.value)
    assert isinstance(info.value, UserError)


def test_duplicate_idx_and_missing_files_are_user_errors(tmp_path):
    path = tmp_path / "dup.jsonl"
    record = json.dumps({**OFFICIAL_ROW, "idx": 4})
    path.write_text(record + "\n" + record + "\n")
    with pytest.raises(QueryError, match="idx 4 appears twice"):
        load_queries(path)
    with pytest.raises(QueryError, match="does not exist"):
        load_queries(tmp_path / "nope.jsonl")


def test_a_stratified_prefix_keeps_the_level_mix_in_file_order():
    base = Query.from_dict({**OFFICIAL_ROW, "idx": 0})
    levels = "hard easy medium hard hard hard hard hard easy medium easy medium easy easy hard easy".split()
    queries = [Query.from_dict({**base.to_dict(), "idx": i, "level": level}) for i, level in enumerate(levels)]
    # 6 easy, 3 medium, 7 hard: 5 of them split 1.875 : 0.9375 : 2.1875 -> 2 easy, 1 medium, 2 hard
    kept = level_stratified_prefix(queries, 5)
    assert [q.idx for q in kept] == [0, 1, 2, 3, 8]
    assert [q.level for q in kept] == ["hard", "easy", "medium", "hard", "easy"]
    assert level_stratified_prefix(queries, 16) == queries and level_stratified_prefix(queries, 99) == queries
