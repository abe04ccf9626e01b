"""Property tests: the plan parser and both evaluator modes never raise, whatever the plan looks like."""
from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from components.travel.evaluate import COMMONSENSE_CHECKS, HARD_CHECKS, evaluate_plan
from components.travel.plans import PLAN_FIELDS, parse_plan
from components.travel.tasks import Query

JSON_LIKE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=30),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=5),
    max_leaves=25,
)
FRAGMENTS = ["from ", " to ", ", ", ";", "-", "(", ")", "Flight Number: ", "F0001", "Self-driving", "self-driving",
             "Taxi", "Driving", "Cost: 12", "You don't need to fill in the information for this or later days."]


def plan_text(world) -> st.SearchStrategy[str]:
    """Field values stitched from the world's own names and the plan grammar's keywords."""
    city = world.cities[0]
    words = FRAGMENTS + world.cities[:4]
    words += [row["Name"] for row in world.restaurants_in(city)[:3]]
    words += [row["NAME"] for row in world.accommodations_in(city)[:2]]
    return st.lists(st.sampled_from(words), max_size=6).map("".join) | st.text(max_size=20)


def day_dicts(world) -> st.SearchStrategy[dict]:
    value = plan_text(world) | st.none() | st.integers() | st.lists(st.text(max_size=8), max_size=3)
    return st.dictionaries(st.sampled_from([*PLAN_FIELDS, "day", "cost"]), value, max_size=9)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300) | st.binary(max_size=100) | JSON_LIKE)
def test_parse_plan_never_raises(value):
    plan, error = parse_plan(value)
    assert (plan is None) != (error is None)
    if plan is not None:
        assert all(isinstance(day, dict) for day in plan)
        json.dumps(plan, default=str)


@settings(max_examples=150, deadline=None)
@given(JSON_LIKE.map(json.dumps))
def test_parse_plan_on_json_text_never_raises(text):
    plan, error = parse_plan(text)
    assert (plan is None) != (error is None)


def fuzz_query(world, days: int, people: int) -> Query:
    city, other = world.cities[0], world.cities[1]
    return Query(idx=0, org=city, dest=world.state_of(other) if days > 3 else other, days=days,
                 visiting_city_number={3: 1, 5: 2, 7: 3}[days], date=tuple(world.dates[:days]),
                 people_number=people,
                 local_constraint={"house rule": "pets", "cuisine": ["Chinese"], "room type": "not shared room",
                                   "transportation": "no self-driving"},
                 budget=2000, level="hard")


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_both_evaluator_modes_never_raise(tiny_world, data):
    days = data.draw(st.sampled_from([3, 5, 7]))
    query = fuzz_query(tiny_world, days, data.draw(st.integers(1, 9)))
    plan = data.draw(st.lists(day_dicts(tiny_world), max_size=8) | JSON_LIKE)
    for mode in ("official", "strict"):
        evaluation = evaluate_plan(tiny_world, query, plan, mode)
        assert set(evaluation.commonsense) == set(COMMONSENSE_CHECKS) and set(evaluation.hard) == set(HARD_CHECKS)
        assert all(r.status in ("pass", "fail", "n/a") for r in (*evaluation.commonsense.values(),
                                                                 *evaluation.hard.values()))
        assert not evaluation.final_pass or evaluation.delivered
