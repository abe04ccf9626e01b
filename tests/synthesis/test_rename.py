"""Fresh names per SFT record: a renamed record is a correct trajectory of the world renamed the same way."""
import dataclasses
import json
import re

import pandas as pd
import pytest

from components.agent.loop import Limits, run_episodes, travel_episodes, travel_evaluate
from components.synthesis.expert import SLIP_PATTERN, ExpertConfig, ExpertPolicy, slip_name
from components.synthesis.filter import FilterParams, estimate_counter, filter_trajectories
from components.synthesis.rename import Renamer, world_name_words
from components.travel.env import TravelEnv
from components.travel.evaluator import evaluate_plan
from components.travel.world import World


def kept_records(world, queries, slip_rate=0.0):
    policy = ExpertPolicy(ExpertConfig(mistake_rate=0.0, seed=0, slip_rate=slip_rate))
    records = run_episodes(travel_episodes(world, queries), policy, Limits(),
                           evaluate=travel_evaluate(world), progress=False)
    kept, _ = filter_trajectories(records, FilterParams(), estimate_counter(4.0))
    by_idx = {q.idx: q for q in queries}
    return [(record, by_idx[record["idx"]]) for record in kept]


@pytest.fixture(scope="module")
def sft_records(tiny_world, many_queries):
    return kept_records(tiny_world, many_queries[:40])


@pytest.fixture(scope="module")
def slipped_records(hinted_world, many_queries):
    """Records with slips over the world whose unknown-city errors suggest cities (the renamer derives hints)."""
    return kept_records(hinted_world, many_queries[:6], slip_rate=0.5)


def renamed_world(world_dir, substitute) -> World:
    """The world's tables with every text cell passed through `substitute` (what the record's world would be)."""
    frames = {}
    for path in sorted(world_dir.glob("*.parquet")):
        frame = pd.read_parquet(path)
        for column in frame.columns:
            if not pd.api.types.is_numeric_dtype(frame[column]):
                frame[column] = frame[column].astype(str).map(substitute)
        frames[path.stem] = frame
    manifest = json.loads((world_dir / "manifest.json").read_text())
    holdout = [substitute(state) for state in manifest["holdout_states"]]
    return World.from_frames(**frames, holdout_states=holdout, manifest=manifest)


def renamed_query(query, substitute):
    return dataclasses.replace(query, org=substitute(query.org), dest=substitute(query.dest),
                               query=substitute(query.query))


def test_a_renamed_record_replays_exactly_in_the_renamed_world_and_its_plan_passes(
        hinted_world, hinted_world_dir, sft_records, slipped_records):
    # The hinted world has the tiny world's tables: the plain records replay in it too.
    renamer = Renamer(world_name_words(hinted_world), seed=7, cities=hinted_world.cities,
                      hint_cities=hinted_world.city_hints)
    flying = [pair for pair in sft_records if "SearchFlight" in json.dumps(pair[0]["messages"])]
    slipped = [pair for pair in slipped_records if "Did you mean" in json.dumps(pair[0]["messages"])]
    assert slipped
    for index, (record, query) in enumerate(sft_records[:3] + flying[:1] + slipped[:2]):
        renamed, substitute = renamer.rename(record, index)
        world = renamed_world(hinted_world_dir, substitute)
        env = TravelEnv(world, renamed_query(query, substitute))
        assert env.reset() == [{"role": m["role"], "content": m["content"]} for m in renamed["messages"][:2]]
        messages = renamed["messages"][2:]
        for turn, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            step = env.step(message["content"])
            if step.done:
                assert turn == len(messages) - 1
                result = evaluate_plan(world, renamed_query(query, substitute), step.info["plan"], mode="strict")
                assert result.final_pass, result
            else:
                assert step.observation == messages[turn + 1]["content"]


def test_no_name_of_the_world_survives_and_one_name_keeps_one_fresh_word(tiny_world, sft_records):
    names = world_name_words(tiny_world)
    record, query = sft_records[0]
    renamed = Renamer(names).record(record, 0)
    text = "\n".join(m["content"] for m in renamed["messages"][1:])
    assert not names & set(re.findall(r"[A-Za-z]+", text))
    assert query.org not in text and query.dest not in text
    first_call = json.loads(re.search(r"<tool_call>(.*)</tool_call>", renamed["messages"][2]["content"]).group(1))
    named = [value for value in first_call["arguments"].values() if value[:1].isupper()]
    assert named and all(value in renamed["messages"][1]["content"] for value in named)
    assert renamed["messages"][0] == record["messages"][0]


def test_renaming_is_seeded_per_record_and_differs_between_records(tiny_world, sft_records):
    renamer = Renamer(world_name_words(tiny_world), seed=0)
    record, _ = sft_records[0]
    assert renamer.record(record, 0) == renamer.record(record, 0)
    assert renamer.record(record, 0)["messages"][1] != renamer.record(record, 1)["messages"][1]
    assert Renamer(world_name_words(tiny_world), seed=1).record(record, 0) != renamer.record(record, 0)


def test_token_ids_are_dropped_because_the_text_changed(tiny_world, sft_records):
    record = {**sft_records[0][0], "prompt_ids": [1], "response_ids": [2], "response_mask": [1]}
    renamed = Renamer(world_name_words(tiny_world)).record(record, 0)
    assert not {"prompt_ids", "response_ids", "response_mask"} & set(renamed)
    assert renamed["idx"] == record["idx"]


def test_a_slipped_name_stays_the_same_slip_of_the_renamed_city(hinted_world, slipped_records):
    renamer = Renamer(world_name_words(hinted_world), seed=3, cities=hinted_world.cities,
                      hint_cities=hinted_world.city_hints)
    checked = 0
    for index, (record, _) in enumerate(slipped_records):
        renamed = renamer.record(record, index)
        for message in renamed["messages"]:
            for wrong, right in SLIP_PATTERN.findall(message["content"]):
                assert wrong == slip_name(right) and right not in json.dumps(record["messages"])
                checked += 1
    assert checked >= 2
