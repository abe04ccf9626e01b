"""Where a plan repeats a place, in characters of its answer turn (`rl.rejected_turn_kinds: [repeat]`)."""
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from components.training.rl.repeats import repeat_spans
from components.travel.evaluator import RepeatedPlace, repeated_places


def day(n, breakfast="-", lunch="-", dinner="-", attraction="-"):
    return {"days": n, "current_city": "Brimo", "transportation": "-", "breakfast": breakfast,
            "attraction": attraction, "lunch": lunch, "dinner": dinner, "accommodation": "Venzorash Loft, Brimo"}


def answer(days) -> str:
    return "<think>done</think><answer>" + json.dumps(days) + "</answer>"


def spanned(text, spans):
    return [text[a:b] for a, b in spans]


def test_repeated_places_lists_every_naming_after_the_first_in_day_order():
    days = [day(1, lunch="Quizor Grill, Brimo", attraction="Ronor Lake, Brimo;"),
            day(2, breakfast="Bana Kitchen, Brimo", lunch="quizor grill, brimo", dinner="Quizor Grill, Brimo",
                attraction="Rotor Gallery, Brimo;Ronor Lake, Brimo;")]
    assert repeated_places(days) == [RepeatedPlace(1, "lunch", "quizor grill, brimo"),
                                     RepeatedPlace(1, "dinner", "Quizor Grill, Brimo"),
                                     RepeatedPlace(1, "attraction", "Ronor Lake, Brimo")]
    assert repeated_places([day(1, lunch="Quizor Grill, Brimo", dinner="Bana Kitchen, Brimo")]) == []


def test_a_repeated_dinner_is_spanned_at_its_second_naming_only():
    text = answer([day(1, lunch="Stermer Table, Palavi"),
                   day(2, breakfast="Bana Kitchen, Palavi", lunch="Zorno Eatery, Palavi",
                       dinner="Stermer Table, Palavi")])
    spans = repeat_spans(text)
    assert spanned(text, spans) == ["Stermer Table, Palavi"]
    assert spans[0][0] > text.index("Stermer Table") and text[:spans[0][0]].endswith('"dinner": "')


def test_a_repeated_attraction_is_spanned_as_the_item_inside_its_list():
    text = answer([day(1, attraction="Ronor Lake, Brimo;"),
                   day(2, attraction="Rotor Gallery, Brimo;Ronor Lake, Brimo;")])
    (span,) = repeat_spans(text)
    assert text[span[0]:span[1]] == "Ronor Lake, Brimo" and text[span[0] - 1] == ";"


def test_plans_that_do_not_line_up_give_no_spans():
    lined = answer([day(1, lunch="A Grill, X"), day(2, lunch="A Grill, X")])
    assert len(repeat_spans(lined)) == 1
    assert repeat_spans(lined.replace('"breakfast": "-", ', "", 1)) == []  # day 1 without a breakfast key
    assert repeat_spans("<think>the plan: lunch A Grill, X and dinner A Grill, X</think>") == []  # no answer
    assert repeat_spans(answer([day(1)])) == []


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_any_text_gives_spans_inside_it(text):
    for start, end in repeat_spans("<answer>" + text):
        assert 0 <= start <= end <= len(text) + len("<answer>")
