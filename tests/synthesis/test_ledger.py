"""The running plan in SFT thinks (`filter.ledger`): each think restates what the episode has shown so far."""
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from components.models.base import tokenizer_texts
from components.synthesis.filter import FilterParams, estimate_counter, filter_trajectories
from components.synthesis.ledger import (LEDGER_BLOCK, LEDGER_LEAD, ROUTE_LEAD, ledger_text, with_ledger,
                                         without_ledger)
from components.synthesis.rename import Renamer, world_name_words
from components.agent.loop import Limits, run_episodes, travel_episodes, travel_evaluate
from components.synthesis.expert import ExpertConfig, ExpertPolicy

PLAN = [
    {"days": 1, "current_city": "from Sava to Zorpel",
     "transportation": "Self-driving, from Sava to Zorpel, duration: 43 mins, distance: 54 km, cost: 2",
     "breakfast": "-", "attraction": "-", "lunch": "-", "dinner": "Pelhelva Table, Zorpel",
     "accommodation": "Heltorno Cottage, Zorpel"},
    {"days": 2, "current_city": "Zorpel", "transportation": "-", "breakfast": "-",
     "attraction": "Droga Tower, Zorpel;", "lunch": "-", "dinner": "-", "accommodation": "-"},
]
QUERY = "A 2-day trip from Sava to Zorpel."
ROUTE = "self-driving, from Sava to Zorpel, duration: 43 mins, distance: 54 km, cost: 2"
STAYS = "Accommodations in Zorpel (1):\nNAME\tprice\nHeltorno Cottage\t183"
FOOD = "Restaurants in Zorpel (1):\nName\tAverage Cost\nPelhelva Table\t44"
SIGHTS = "Attractions in Zorpel (1):\nName\tAddress\nDroga Tower\t8804 Droga St"


def episode(*observations: str) -> list[dict]:
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": QUERY}]
    for number, observation in enumerate(observations):
        messages.append({"role": "assistant", "content": f"<think>call {number}</think><tool_call>{{}}</tool_call>"})
        messages.append({"role": "user", "content": f"<tool_response>\n{observation}\n</tool_response>"})
    messages.append({"role": "assistant", "content": "<think>done</think><answer>[]</answer>"})
    return messages


def thinks(messages: list[dict]) -> list[str]:
    return [re.search(r"<think>(.*?)</think>", m["content"], re.S).group(1)
            for m in messages if m["role"] == "assistant"]


def test_each_field_joins_the_ledger_right_after_the_observation_that_shows_it():
    first, after_route, after_stays, after_food, answer = thinks(with_ledger(episode(ROUTE, STAYS, FOOD, SIGHTS), PLAN))
    assert first == ("Plan so far:\nDay 1: current_city from Sava to Zorpel\nDay 2: current_city Zorpel\n"
                     "call 0")
    assert after_route.splitlines()[1] == f"Day 1: current_city from Sava to Zorpel | transportation {PLAN[0]['transportation']}"
    assert "accommodation Heltorno Cottage, Zorpel" in after_stays and "dinner" not in after_stays
    assert after_food.splitlines()[1].endswith("| dinner Pelhelva Table, Zorpel | accommodation Heltorno Cottage, Zorpel")
    assert answer == ("Plan so far:\n"
                      f"Day 1: current_city from Sava to Zorpel | transportation {PLAN[0]['transportation']} | "
                      "dinner Pelhelva Table, Zorpel | accommodation Heltorno Cottage, Zorpel\n"
                      "Day 2: current_city Zorpel | attraction Droga Tower, Zorpel;\n"
                      "done")


def test_the_route_opens_every_ledger_in_the_form_of_the_copy_tasks_route_rounds():
    first, after_route, *_, answer = thinks(with_ledger(episode(ROUTE, STAYS), PLAN, route=True))

    assert first.startswith("Route: Sava -> Zorpel\nPlan so far:\nDay 1: current_city from Sava to Zorpel\n")
    assert after_route.startswith("Route: Sava -> Zorpel\nPlan so far:\n")
    assert answer.startswith("Route: Sava -> Zorpel\nPlan so far:\n")
    assert [without_ledger(t) for t in (first, answer)] == ["call 0", "done"]  # the tokenizer's corpus is unchanged


def test_the_itinerary_route_names_the_whole_trip_so_the_way_home_is_a_copy_from_the_route_line():
    trip = [{"days": 1, "current_city": "from Sava to Zorpel"}, {"days": 2, "current_city": "Zorpel"},
            {"days": 3, "current_city": "from Zorpel to Kelmo"}, {"days": 4, "current_city": "from Kelmo to Sava"}]
    first = thinks(with_ledger(episode(ROUTE), trip, route=True, itinerary=True))[0]

    assert first.startswith("Route: Sava -> Zorpel\nPlan so far:\n")  # Kelmo is not named yet: the first day's route
    assert ledger_text(trip, [QUERY + " Then Kelmo."], route=True, itinerary=True).startswith(
        "Route: Sava -> Zorpel -> Kelmo -> Sava\nPlan so far:\n")
    assert ledger_text(trip, [QUERY], route=True, itinerary=True, complete=True).startswith(
        "Route: Sava -> Zorpel -> Kelmo -> Sava\n")  # the answer's turn restates everything
    assert ledger_text(trip, [QUERY + " Then Kelmo."], route=True).startswith("Route: Sava -> Zorpel\n")
    assert without_ledger(ledger_text(trip, [QUERY], route=True, itinerary=True, complete=True)) == ""
    with pytest.raises(ValueError, match="set ledger_route: true"):
        FilterParams(ledger=True, ledger_itinerary=True)


def test_a_later_leg_joins_the_ledger_with_the_search_that_shows_it_not_when_its_cities_are_named():
    trip = [PLAN[0], PLAN[1], {"days": 3, "current_city": "from Zorpel to Sava", "breakfast": "Pelhelva Table, Zorpel",
                               "transportation": "Self-driving, from Zorpel to Sava, duration: 43 mins, distance: 54 km, cost: 2"}]
    home = "self-driving, from Zorpel to Sava, duration: 43 mins, distance: 54 km, cost: 2"
    first, *middle, after_home, answer = thinks(with_ledger(episode(ROUTE, FOOD, home, STAYS), trip, route=True,
                                                                     itinerary=True, later_legs_shown=True))

    assert first.startswith("Route: Sava -> Zorpel -> Sava\nPlan so far:\nDay 1: current_city from Sava to Zorpel\n"
                            "Day 2: current_city Zorpel\ncall 0")  # day 3 waits, though both its cities are named
    assert all("Day 3" not in think for think in middle)  # its breakfast too: the day joins with its leg
    assert "Day 3: current_city from Zorpel to Sava | transportation Self-driving, from Zorpel to Sava" in after_home
    assert "Day 3: current_city from Zorpel to Sava" in answer
    assert "Day 3: current_city from Zorpel to Sava\n" in thinks(with_ledger(episode(ROUTE), trip))[0]  # default
    with pytest.raises(ValueError, match="set ledger: true"):
        FilterParams(ledger_later_legs_shown=True)


def test_the_route_waits_for_its_cities_to_be_named_and_needs_the_ledger():
    unnamed = [{"role": "system", "content": "sys"}, {"role": "user", "content": "A 2-day trip."},
               {"role": "assistant", "content": "<think>call</think><tool_call>{}</tool_call>"},
               {"role": "user", "content": "<tool_response>\nno results\n</tool_response>"},
               {"role": "assistant", "content": "<think>done</think><answer>[]</answer>"}]
    first = with_ledger(unnamed, PLAN, route=True)[2]["content"]
    assert first == unnamed[2]["content"]  # nothing evidenced yet: no ledger, no route
    assert ledger_text([{"days": 1, "current_city": "Zorpel"}], [QUERY], route=True) == (
        "Plan so far:\nDay 1: current_city Zorpel\n")  # no "from A to B" on day 1: no route line
    with pytest.raises(ValueError, match="set ledger: true"):
        FilterParams(ledger_route=True)


def test_the_answer_restates_the_whole_plan_even_when_an_observation_is_missing():
    *_, answer = thinks(with_ledger(episode(ROUTE), PLAN))  # no listing was shown: only the answer has them
    assert "Droga Tower, Zorpel;" in answer and "Heltorno Cottage" in answer
    assert "Heltorno" not in " ".join(thinks(with_ledger(episode(ROUTE), PLAN))[:-1])


def test_no_plan_no_ledger_and_taking_it_out_gives_the_original_text():
    messages = episode(ROUTE, STAYS)
    assert with_ledger(messages, None) == messages and with_ledger(messages, []) == messages
    assert [without_ledger(m["content"]) for m in with_ledger(messages, PLAN)] == [m["content"] for m in messages]


@settings(max_examples=150, deadline=None)
@given(plan=st.lists(st.dictionaries(st.sampled_from(["days", "current_city", "transportation", "breakfast",
                                                      "attraction", "dinner", "accommodation", "junk"]),
                                     st.one_of(st.text(max_size=30), st.integers(), st.none())), max_size=4),
       observations=st.lists(st.text(max_size=60), max_size=4), route=st.booleans(), itinerary=st.booleans(),
       later_legs_shown=st.booleans())
def test_any_plan_and_conversation_get_a_removable_ledger_and_nothing_else_changes(plan, observations, route,
                                                                                   itinerary, later_legs_shown):
    messages = episode(*observations)
    annotated = with_ledger(messages, plan, route=route, itinerary=itinerary, later_legs_shown=later_legs_shown)
    assert len(annotated) == len(messages)
    assert [without_ledger(m["content"]) for m in annotated] == [m["content"] for m in messages]
    for block in (LEDGER_BLOCK.search(m["content"]) for m in annotated if m["role"] == "assistant"):
        assert block is None or block.group(0).startswith((ROUTE_LEAD, LEDGER_LEAD) if route else LEDGER_LEAD)


@pytest.fixture(scope="module")
def expert_records(tiny_world, many_queries):
    """The expert's trajectories (as the teach stage writes them) that the filter keeps."""
    records = run_episodes(travel_episodes(tiny_world, many_queries[:30]), ExpertPolicy(ExpertConfig(seed=0)),
                           Limits(), evaluate=travel_evaluate(tiny_world), progress=False)
    return [r for r in records if r["termination"] == "answer" and r["evaluation"]["strict"]["final_pass"]]


def last_ledger(record: dict) -> list[str]:
    answer = [m for m in record["messages"] if m["role"] == "assistant"][-1]["content"]
    return LEDGER_BLOCK.search(answer).group(0).splitlines()[1:]


def plan_fields(plan: list[dict]) -> list[str]:
    return [f"{key} {day[key]}" for day in plan for key in day if key != "days" and day[key] != "-"]


def test_expert_records_end_with_a_ledger_that_is_the_plan_and_only_name_what_was_shown(expert_records):
    records = expert_records
    kept, _ = filter_trajectories(records, FilterParams(ledger=True), estimate_counter(4.0))
    assert len(kept) == len(records) > 20
    for plain, ledgered in zip(records, kept):
        fields = [field for line in last_ledger(ledgered) for field in line.split(": ", 1)[1].split(" | ")]
        assert fields == plan_fields(plain["plan"])
        shown = ""
        for message in ledgered["messages"][1:]:
            if message["role"] != "assistant":
                shown += message["content"]
                continue
            block = LEDGER_BLOCK.search(message["content"])
            if block and message is not ledgered["messages"][-1]:
                for name in re.findall(r"(?:breakfast|lunch|dinner|accommodation|attraction) ([^,|\n]+),",
                                       block.group(0)):
                    assert name in shown
    # The tokenizer reads the records without their ledgers: the same corpus, so the same vocabulary.
    plain_kept, _ = filter_trajectories(records, FilterParams(), estimate_counter(4.0))
    assert list(tokenizer_texts(kept)) == list(tokenizer_texts(plain_kept))


def test_a_renamed_ledger_names_the_renamed_plan(tiny_world, expert_records):
    record = expert_records[0]
    ledgered, _ = filter_trajectories([record], FilterParams(ledger=True), estimate_counter(4.0))
    renamed = Renamer(world_name_words(tiny_world), seed=1).record(ledgered[0], 0)
    answer = renamed["messages"][-1]["content"]
    plan = json.loads(re.search(r"<answer>(.*)</answer>", answer, re.S).group(1))
    fields = [field for line in last_ledger(renamed) for field in line.split(": ", 1)[1].split(" | ")]
    assert fields == plan_fields(plan) and plan != record["plan"]
