"""The travel episode: reset, tool turns, protocol errors, answers, failure injection."""
import json

from components.travel.env import TravelEnv
from components.travel.protocol import system_prompt
from components.travel.tasks import Query
from components.travel.tools import TOOL_SCHEMAS


def a_query(world, text="Plan a 3-day trip for one person."):
    org, dest = world.cities[0], world.cities[5]
    return Query(idx=7, org=org, dest=dest, days=3, visiting_city_number=1,
                 date=("2022-03-05", "2022-03-06", "2022-03-07"), people_number=1, budget=1800, query=text)


def call(name, **arguments):
    return f'<think>look it up</think><tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


def test_reset_gives_the_system_prompt_and_the_query_text(tiny_world):
    env = TravelEnv(tiny_world, a_query(tiny_world, "From A to B please."))
    assert env.reset() == [{"role": "system", "content": system_prompt(TOOL_SCHEMAS)},
                           {"role": "user", "content": "From A to B please."}]


def test_a_tool_turn_returns_the_observation_in_a_tool_response(tiny_world):
    env = TravelEnv(tiny_world, a_query(tiny_world))
    env.reset()
    city = tiny_world.cities[0]
    step = env.step(call("SearchRestaurant", city=city))
    assert not step.done
    assert step.observation.startswith(f"<tool_response>\nRestaurants in {city} (")
    assert step.info == {"kind": "tool", "tool": "SearchRestaurant", "arguments": {"city": city},
                         "tool_error": False, "plan": None}
    bad = env.step(call("SearchRestaurant", city="Atlantis"))
    assert bad.info["tool_error"] and "Unknown city 'Atlantis'" in bad.observation


def test_a_malformed_turn_gets_the_format_back_and_counts(tiny_world):
    env = TravelEnv(tiny_world, a_query(tiny_world), max_protocol_errors=2)
    env.reset()
    first = env.step("I think I should search for flights.")
    assert not first.done and first.info["kind"] == "protocol_error"
    assert first.observation.startswith("<tool_response>\nError: ") and "<tool_call>" in first.observation
    second = env.step("still no format")
    assert second.done and second.info["termination"] == "protocol_errors" and second.observation is None


def test_an_answer_ends_the_episode_with_the_parsed_plan(tiny_world):
    env = TravelEnv(tiny_world, a_query(tiny_world))
    env.reset()
    plan = [{"days": 1, "current_city": "A", "transportation": "-", "breakfast": "-", "attraction": "-",
             "lunch": "-", "dinner": "-", "accommodation": "-"}]
    step = env.step(f"<think>done</think><answer>{json.dumps(plan)}</answer>")
    assert step.done and step.observation is None
    assert step.info["kind"] == "answer" and step.info["termination"] == "answer"
    assert step.info["plan"][0]["current_city"] == "A"


def test_an_unparseable_answer_still_ends_the_episode_without_a_plan(tiny_world):
    env = TravelEnv(tiny_world, {"query": "a trip"})
    env.reset()
    step = env.step("<think>done</think><answer>I could not find a plan.</answer>")
    assert step.done and step.info["plan"] is None and step.info["plan_error"]


def test_failure_injection_is_reproducible_per_seed(tiny_world):
    def errors(seed):
        env = TravelEnv(tiny_world, a_query(tiny_world), failure_rate=0.5, seed=seed)
        env.reset()
        return [env.step(call("SearchCity", state=tiny_world.states[0])).info["tool_error"] for _ in range(40)]

    assert errors(3) == errors(3)
    assert 5 < sum(errors(3)) < 35
    assert errors(3) != errors(4)


def test_the_sandbox_never_imports_torch_or_transformers():
    import subprocess
    import sys

    code = ("import sys, components.travel.env, components.travel.commands, components.travel.importer, "
            "components.travel.synthetic; bad = {'torch', 'transformers'} & set(sys.modules); "
            "sys.exit(f'imported {bad}' if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
