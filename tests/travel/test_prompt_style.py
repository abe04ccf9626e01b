"""The system prompt's style: "full" (real presets) or "compact" (the tiny preset), chosen once by the world.

The style is a world parameter recorded in manifest.json, so every stage that builds episodes over a world (teacher,
RL, validation) shows the model the same system prompt.
"""
import json
from pathlib import Path

import pytest

from components.travel.env import TravelEnv
from components.agent.tool_calls import tool_signature
from components.travel.protocol import parse_turn, system_prompt
from components.travel.tasks import Query
from components.travel.synthetic import tiny_world_params, write_synthetic_world
from components.travel.tools import TOOL_NAMES, TOOL_SCHEMAS
from components.travel.world import World


def a_query(world):
    return Query(idx=1, org=world.cities[0], dest=world.cities[5], days=3, visiting_city_number=1,
                 date=("2022-03-05", "2022-03-06", "2022-03-07"), people_number=1, budget=1800,
                 query="Plan a 3-day trip for one person.")


@pytest.fixture(scope="module")
def compact_world_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("compact_world")
    write_synthetic_world(tiny_world_params(prompt_style="compact"), out)
    return out


def test_the_compact_prompt_keeps_rules_signatures_and_formats_in_a_few_hundred_characters():
    prompt = system_prompt(TOOL_SCHEMAS, style="compact")
    assert len(prompt) < 800 < len(system_prompt(TOOL_SCHEMAS))
    for line in ("SearchFlight(departure, destination, date)", "GoogleDistanceMatrix(departure, destination, "
                 "mode: driving|taxi)", "SearchAccommodation(city)", "SearchCity(state)"):
        assert line in prompt.splitlines()
    assert "budget" in prompt and "minimum nights" in prompt and "one tool call per turn" in prompt
    assert "<tool_call>" in prompt and "<answer>" in prompt and "current_city" in prompt


def test_a_tool_signature_is_the_name_and_its_arguments():
    signatures = [tool_signature(schema) for schema in TOOL_SCHEMAS]
    assert [s.split("(")[0] for s in signatures] == list(TOOL_NAMES)
    assert tool_signature({"function": {"name": "search", "parameters": {"properties": {"query": {}}}}}) == \
        "search(query)"


def test_the_compact_prompt_for_other_tools_stays_generic():
    search = {"type": "function", "function": {"name": "search",
                                               "parameters": {"type": "object", "properties": {"query": {}}}}}
    prompt = system_prompt([search], style="compact")
    assert "travel" not in prompt.lower() and "search(query)" in prompt


def test_an_unknown_style_is_refused():
    with pytest.raises(ValueError, match="compact"):
        system_prompt(TOOL_SCHEMAS, style="short")


def test_the_world_records_its_prompt_style_and_the_env_uses_it(compact_world_dir, tiny_world_dir):
    manifest = json.loads((compact_world_dir / "manifest.json").read_text())
    assert manifest["prompt_style"] == "compact" and manifest["params"]["prompt_style"] == "compact"
    compact, full = World.load(compact_world_dir), World.load(tiny_world_dir)
    assert (compact.prompt_style, full.prompt_style) == ("compact", "full")
    assert TravelEnv(compact, a_query(compact)).reset()[0]["content"] == system_prompt(TOOL_SCHEMAS, style="compact")
    assert TravelEnv(full, a_query(full)).reset()[0]["content"] == system_prompt(TOOL_SCHEMAS)


def test_an_explicit_style_overrides_the_world_and_a_world_without_one_is_full(compact_world_dir, tmp_path):
    compact = World.load(compact_world_dir)
    env = TravelEnv(compact, a_query(compact), prompt_style="full")
    assert env.reset()[0]["content"] == system_prompt(TOOL_SCHEMAS)
    manifest = json.loads((compact_world_dir / "manifest.json").read_text())
    del manifest["prompt_style"]  # a world written before the option existed
    assert World.from_frames(**_frames(compact_world_dir), manifest=manifest).prompt_style == "full"


def test_an_episode_over_a_compact_world_plays_by_the_same_protocol(compact_world_dir):
    world = World.load(compact_world_dir)
    env = TravelEnv(world, a_query(world))
    env.reset()
    call = {"name": "SearchAttraction", "arguments": {"city": world.cities[5]}}
    step = env.step(f"<think>sights</think><tool_call>{json.dumps(call)}</tool_call>")
    assert step.info["kind"] == "tool" and step.observation.startswith("<tool_response>\n")
    assert parse_turn('<think>done</think><answer>[]</answer>').text == "[]"


def test_star_world_build_writes_the_style_from_params(tmp_path, capsys):
    from components.cli import main

    params = tmp_path / "world.yaml"
    params.write_text("world:\n  source: synthetic\n  states: 3\n  holdout_states: 0\n  flight_id_digits: 5\n"
                      "  prompt_style: compact\n")
    assert main(["world", "build", "--params", str(params), "--out", str(tmp_path / "w")]) == 0
    assert "prompt style compact" in capsys.readouterr().out
    assert World.load(tmp_path / "w").prompt_style == "compact"
    params.write_text("world:\n  source: synthetic\n  prompt_style: tiny\n")
    assert main(["world", "build", "--params", str(params), "--out", str(tmp_path / "x")]) == 1
    assert "prompt_style" in capsys.readouterr().err


def _frames(directory):
    import pyarrow.parquet as pq

    from components.travel.world import TABLES

    return {name: pq.read_table(directory / f"{name}.parquet") for name in TABLES}


def test_the_tiny_preset_world_uses_the_compact_prompt_and_fits_its_flight_ids(tmp_path):
    from components.params import load_section
    from components.travel.synthetic import WorldParams

    params = load_section(Path(__file__).resolve().parents[2] / "params" / "world.yaml", "world", WorldParams)
    if params.source != "synthetic":
        pytest.skip("params/world.yaml holds a real preset (star preset use tiny restores the tiny world)")
    manifest = write_synthetic_world(params, tmp_path / "w")
    assert manifest["prompt_style"] == "compact"
    assert manifest["tables"]["flights"]["rows"] < 10 ** params.flight_id_digits
    world = World.load(tmp_path / "w")
    assert len(world.holdout_states) == params.holdout_states and len(world.cities) >= 60
