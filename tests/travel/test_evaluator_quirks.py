"""Each quirk of the public evaluator: `official` reproduces it, `strict` fixes it.

The world is hand-made and tiny so every number below can be checked by reading it.
"""
from __future__ import annotations

import copy

import pandas as pd
import pytest

from components.travel.evaluate import COMMONSENSE_CHECKS, HARD_CHECKS, evaluate_plan
from components.travel.tasks import Query
from components.travel.reward import reward
from components.travel.world import World

DATES = ("2022-03-01", "2022-03-02", "2022-03-03")


def _flight(number, origin, dest, date, price, dep="08:00", arr="10:00"):
    return {"Flight Number": number, "Price": price, "DepTime": dep, "ArrTime": arr, "ActualElapsedTime": "2 hours",
            "FlightDate": date, "OriginCityName": origin, "DestCityName": dest, "Distance": 90.0}


def _restaurant(name, cost, cuisines, city="Springfield"):
    return {"Name": name, "Average Cost": cost, "Cuisines": cuisines, "Aggregate Rating": 4.0, "City": city}


def _listing(name, price, room, rules, minimum, occupancy=2, city="Springfield"):
    return {"NAME": name, "price": price, "room type": room, "house_rules": rules, "minimum nights": minimum,
            "maximum occupancy": occupancy, "review rate number": 4.0, "city": city}


@pytest.fixture(scope="module")
def world() -> World:
    flights = pd.DataFrame([
        _flight("F0000001", "Boston", "Springfield", "2022-03-01", 100),
        _flight("F0000002", "Springfield", "Boston", "2022-03-03", 120, "18:00", "20:00"),
        _flight("F0000003", "Springfield", "Boston", "2022-03-05", 80),
    ])
    restaurants = pd.DataFrame([
        _restaurant("Pizza Place", 20, "Pizza, Italian"),
        _restaurant("Tea House", 10, "Tea, Chinese"),
        _restaurant("Taco Stand", 15, "Mexican"),
        _restaurant("Burger Barn", 12, "American, Fast Food"),
        _restaurant("Curry Corner", 18, "Indian"),
        _restaurant("Sushi Bar", 30, "Seafood"),
        _restaurant("Le Bistro", 40, "French"),
        _restaurant("Bean Cafe", 9, "Cafe, French", city="Boston"),
    ])
    attractions = pd.DataFrame([
        {"Name": name, "Latitude": 0.0, "Longitude": 0.0, "Address": "-", "Phone": "-", "Website": "-",
         "City": "Springfield"}
        for name in ("City Museum", "River Park", "Old Fort", "Zoo")
    ])
    accommodations = pd.DataFrame([
        _listing("Party House", 100, "Entire home/apt", "No smoking", 1),
        _listing("Quiet Room", 50, "Private room", "No parties", 3),
        _listing("Quiet Room Annex", 60, "Private room", "No parties", 1),
        _listing("Loft No Parties", 90, "Entire home/apt", "No parties", 1),
    ])
    distance = pd.DataFrame([
        {"origin": "Boston", "destination": "Springfield", "duration": "2 hours", "distance": "150 km"},
        {"origin": "Springfield", "destination": "Boston", "duration": "2 hours", "distance": "150 km"},
    ])
    cities = pd.DataFrame([{"City": "Boston", "State": "Massachusetts"},
                           {"City": "Springfield", "State": "Illinois"}])
    return World.from_frames(flights, accommodations, restaurants, attractions, distance, cities)


def make_query(**local) -> Query:
    constraint = {"house rule": None, "cuisine": None, "room type": None, "transportation": None, **local}
    return Query(idx=0, org="Boston", dest="Springfield", days=3, visiting_city_number=1, date=DATES,
                 people_number=1, local_constraint=constraint, budget=1000, level="hard" if local else "easy")


GOOD_PLAN = [
    {"days": 1, "current_city": "from Boston to Springfield",
     "transportation": "Flight Number: F0000001, from Boston to Springfield, Departure Time: 08:00, Arrival Time: 10:00",
     "breakfast": "-", "attraction": "City Museum, Springfield;", "lunch": "Pizza Place, Springfield",
     "dinner": "Tea House, Springfield", "accommodation": "Party House, Springfield"},
    {"days": 2, "current_city": "Springfield", "transportation": "-", "breakfast": "Taco Stand, Springfield",
     "attraction": "River Park, Springfield;Old Fort, Springfield;", "lunch": "Burger Barn, Springfield",
     "dinner": "Curry Corner, Springfield", "accommodation": "Party House, Springfield"},
    {"days": 3, "current_city": "from Springfield to Boston",
     "transportation": "Flight Number: F0000002, from Springfield to Boston, Departure Time: 18:00, Arrival Time: 20:00",
     "breakfast": "Sushi Bar, Springfield", "attraction": "Zoo, Springfield;", "lunch": "-", "dinner": "-",
     "accommodation": "-"},
]


def edited(**changes) -> list[dict]:
    """GOOD_PLAN with fields replaced: edited(day2_lunch="X") sets day 2's lunch."""
    plan = copy.deepcopy(GOOD_PLAN)
    for key, value in changes.items():
        day, field = key.split("_", 1)
        plan[int(day[3:]) - 1][field] = value
    return plan


def both(world, query, plan):
    return evaluate_plan(world, query, plan, "official"), evaluate_plan(world, query, plan, "strict")


def test_the_reference_plan_passes_both_modes_with_the_exact_cost(world):
    official, strict = both(world, make_query(), GOOD_PLAN)
    assert official.final_pass and strict.final_pass
    # flights 100 + 120, meals 20+10+15+12+18+30 = 105, two nights at 100 (occupancy 2, one person)
    assert official.total_cost == strict.total_cost == 220 + 105 + 200
    assert set(strict.commonsense) == set(COMMONSENSE_CHECKS) and set(strict.hard) == set(HARD_CHECKS)


def test_current_city_iterates_characters_on_non_travel_days(world):
    plan = edited(day2_lunch="Bean Cafe, Boston")  # a Boston lunch while staying in Springfield
    official, strict = both(world, make_query(), plan)
    assert official.commonsense["is_valid_information_in_current_city"].passed  # 'n' of Springfield is in "Bean"
    assert strict.commonsense["is_valid_information_in_current_city"].failed
    assert "not in Springfield" in strict.commonsense["is_valid_information_in_current_city"].reason


def test_last_attraction_without_trailing_semicolon_is_never_checked(world):
    plan = edited(day2_attraction="River Park, Springfield;Atlantis, Springfield")
    official, strict = both(world, make_query(), plan)
    assert official.commonsense["is_valid_information_in_sandbox"].passed
    assert strict.commonsense["is_valid_information_in_sandbox"].failed
    assert "Atlantis" in strict.commonsense["is_valid_information_in_sandbox"].reason


def test_flight_dates_are_never_checked(world):
    plan = edited(day3_transportation="Flight Number: F0000003, from Springfield to Boston, "
                                      "Departure Time: 08:00, Arrival Time: 10:00")  # flies on 2022-03-05
    official, strict = both(world, make_query(), plan)
    assert official.final_pass
    assert official.total_cost == 100 + 80 + 105 + 200
    reason = strict.commonsense["is_valid_information_in_sandbox"].reason
    assert strict.commonsense["is_valid_information_in_sandbox"].failed and "2022-03-05" in reason


def test_flight_times_are_never_checked(world):
    plan = edited(day1_transportation="Flight Number: F0000001, from Boston to Springfield, "
                                      "Departure Time: 06:00, Arrival Time: 07:00")
    official, strict = both(world, make_query(), plan)
    assert official.commonsense["is_valid_information_in_sandbox"].passed
    assert "departure time is 08:00" in strict.commonsense["is_valid_information_in_sandbox"].reason


def test_minimum_nights_skipped_when_a_name_matches_several_listings(world):
    # "Quiet Room" (minimum 3 nights) is a substring of "Quiet Room Annex": two matches, the official code skips.
    plan = edited(day1_accommodation="Quiet Room, Springfield", day2_accommodation="Quiet Room, Springfield")
    official, strict = both(world, make_query(), plan)
    assert official.commonsense["is_valid_accommodation"].passed
    assert strict.commonsense["is_valid_accommodation"].failed
    assert "at least 3 nights" in strict.commonsense["is_valid_accommodation"].reason


def test_cuisine_check_skips_the_rest_of_a_day_after_an_origin_city_meal(world):
    # Day 1 breakfast in the origin, French lunch at Le Bistro: the official loop never reaches the lunch.
    plan = edited(day1_breakfast="Bean Cafe, Boston", day1_lunch="Le Bistro, Springfield")
    official, strict = both(world, make_query(cuisine=["French"]), plan)
    assert official.hard["valid_cuisine"].failed and "French" in official.hard["valid_cuisine"].reason
    assert strict.hard["valid_cuisine"].passed


DRIVE = {"day1_transportation": "self-driving, from Boston to Springfield, duration: 2 hours, distance: 150 km, "
                                "cost: 7",
         "day3_transportation": "self-driving, from Springfield to Boston, duration: 2 hours, distance: 150 km, "
                                "cost: 7"}


def test_transportation_ban_is_matched_case_sensitively(world):
    official, strict = both(world, make_query(transportation="no self-driving"), edited(**DRIVE))
    assert official.commonsense["is_valid_information_in_sandbox"].passed
    assert official.hard["valid_transportation"].passed  # "self-driving" is not "Self-driving"
    assert strict.hard["valid_transportation"].failed
    assert official.total_cost == strict.total_cost == 7 + 7 + 105 + 200  # int(150 km * 0.05) per car and leg


def test_unknown_transport_text_passes_the_sandbox_and_costs_nothing(world):
    # The reward hack RL agents found: "Driving" is neither flight, self-driving nor taxi.
    hack = edited(day1_transportation="Driving, from Boston to Springfield",
                  day3_transportation="Driving, from Springfield to Boston")
    query = make_query(transportation="no flight")
    official, strict = both(world, query, hack)
    assert official.final_pass
    assert official.total_cost == 105 + 200
    assert strict.commonsense["is_valid_information_in_sandbox"].failed
    assert "not a flight, self-driving or taxi" in strict.commonsense["is_valid_information_in_sandbox"].reason
    assert not strict.final_pass


def test_a_parties_house_rule_rejects_a_no_parties_listing_in_both_modes(world):
    # The public hard_constraint.py tests 'parties'; only the annotation tool's utils/func.py spells it 'parities'.
    plan = edited(day1_accommodation="Loft No Parties, Springfield", day2_accommodation="Loft No Parties, Springfield")
    official, strict = both(world, make_query(**{"house rule": "parties"}), plan)
    assert official.hard["valid_room_rule"].failed and official.hard["valid_room_rule"].reason == (
        "The house rule should be parties.")
    assert strict.hard["valid_room_rule"].failed and "No parties" in strict.hard["valid_room_rule"].reason


def test_a_malformed_plan_fails_checks_instead_of_crashing(world):
    plan = edited(day2_current_city=None, day3_transportation="flight number: F0000002 Springfield Boston")
    del plan[0]["breakfast"]
    official, strict = both(world, make_query(), plan)
    for evaluation in (official, strict):
        assert evaluation.delivered and not evaluation.final_pass
        assert evaluation.commonsense["is_not_absent"].failed
        assert all(r.status in ("pass", "fail", "n/a") for r in evaluation.hard.values())
    assert official.commonsense["is_valid_information_in_sandbox"].reason.startswith("malformed plan")


def test_an_absent_plan_is_not_delivered_and_fails_every_check(world):
    for plan in (None, []):
        evaluation = evaluate_plan(world, make_query(cuisine=["French"]), plan, "strict")
        assert not evaluation.delivered
        assert all(r.failed for r in evaluation.commonsense.values())
        assert evaluation.hard["valid_cuisine"].failed and evaluation.hard["valid_room_type"].status == "n/a"


def test_unknown_mode_is_rejected(world):
    with pytest.raises(ValueError, match="mode must be one of"):
        evaluate_plan(world, make_query(), GOOD_PLAN, "lenient")


def test_name_matches_are_cached_beside_the_world_not_on_it(world):
    from components.travel.evaluate import lookup_for

    before = dict(vars(world))
    lookup = lookup_for(world)
    assert lookup is lookup_for(world)
    assert [row["NAME"] for row in lookup.official("accommodation", "Quiet Room", "Springfield")] == \
        ["Quiet Room", "Quiet Room Annex"]
    assert [row["NAME"] for row in lookup.strict("accommodation", "quiet  room", "Springfield")] == ["Quiet Room"]
    assert vars(world) == before


def test_repeated_places_lists_every_naming_after_the_first_in_day_order():
    """What the strict restaurants and attractions checks fail on: a place named again, in any case."""
    from components.travel.strict_checks import RepeatedPlace, repeated_places

    def day(n, breakfast="-", lunch="-", dinner="-", attraction="-"):
        return {"days": n, "current_city": "Brimo", "transportation": "-", "breakfast": breakfast,
                "attraction": attraction, "lunch": lunch, "dinner": dinner, "accommodation": "Venzorash Loft, Brimo"}

    days = [day(1, lunch="Quizor Grill, Brimo", attraction="Ronor Lake, Brimo;"),
            day(2, breakfast="Bana Kitchen, Brimo", lunch="quizor grill, brimo", dinner="Quizor Grill, Brimo",
                attraction="Rotor Gallery, Brimo;Ronor Lake, Brimo;")]
    assert repeated_places(days) == [RepeatedPlace(1, "lunch", "quizor grill, brimo"),
                                     RepeatedPlace(1, "dinner", "Quizor Grill, Brimo"),
                                     RepeatedPlace(1, "attraction", "Ronor Lake, Brimo")]
    assert repeated_places([day(1, lunch="Quizor Grill, Brimo", dinner="Bana Kitchen, Brimo")]) == []


def test_star_evaluate_raw_keeps_an_empty_day_past_the_trip_which_the_public_code_never_reads(world):
    from components.travel.commands import evaluate_file
    from components.travel.plans import parse_plan

    plan = [*copy.deepcopy(GOOD_PLAN), {}]
    assert parse_plan(plan, raw=True) == (plan, None)
    (raw,), _ = evaluate_file(world, [make_query()], {0: plan}, ("official",), raw=True)
    assert raw["evaluation"]["official"]["final_pass"]  # the public checks read days[:query.days] only


@pytest.mark.parametrize("rewrite, broken", [
    (lambda plan: [{("Accommodation" if k == "accommodation" else k): v for k, v in day.items()} for day in plan],
     "a capitalised key"),
    (lambda plan: [{**day, "attraction": [a for a in day["attraction"].split(";") if a]} for day in plan],
     "attractions as a list"),
])
def test_star_evaluate_raw_scores_the_plan_as_written(world, rewrite, broken):
    """`--raw` rewrites nothing: where the public code would crash on the plan, the official check fails with a
    reason; the default (normalised) evaluation reads the same plan as the good one it was made from."""
    from components.travel.commands import evaluate_file

    plan = rewrite(copy.deepcopy(GOOD_PLAN))
    (normalised,), _ = evaluate_file(world, [make_query()], {0: plan}, ("official",))
    (raw,), _ = evaluate_file(world, [make_query()], {0: plan}, ("official",), raw=True)
    assert normalised["evaluation"]["official"]["final_pass"], broken
    verdict = raw["evaluation"]["official"]
    assert not verdict["final_pass"], broken
    failed = [check for group in ("commonsense", "hard") for check in verdict[group].values()
              if check["status"] == "fail"]
    assert failed and all(check["reason"] for check in failed)


def test_a_plan_of_empty_days_earns_no_commonsense_credit(world):
    """A 3-day plan with only `current_city` filled passes six commonsense checks on emptiness; SUM gives it no
    credit for them (it scored 0.15, more than an honest failure), as MACRO and SUCCESS give it none."""
    query = make_query()
    empty_days = [{"day": d, "current_city": city, "transportation": "-", "breakfast": "-", "attraction": "-",
                   "lunch": "-", "dinner": "-", "accommodation": "-"}
                  for d, city in ((1, "from Boston to Springfield"), (2, "Springfield"),
                                  (3, "from Springfield to Boston"))]
    evaluation = evaluate_plan(world, query, empty_days)
    assert evaluation.delivered and not evaluation.commonsense["is_not_absent"].passed
    assert sum(r.passed for r in evaluation.commonsense.values()) >= 5  # the checks that pass on emptiness
    for kind in ("sum", "macro", "success"):
        r = reward(evaluation, kind)
        assert (r.reward, r.cs_micro) == (0.0, 0.0), kind
    assert reward(evaluation, "sum", format_reward=-1.0).reward == 0.0  # a delivered plan: no format penalty
