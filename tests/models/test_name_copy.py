"""The name-copy probe finds each listing name a turn copies from a tool result and scores it by part."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from components.models.name_copy import (CopiedName, copied_names, greedy_hits, name_copy_accuracy,
                                         name_copy_metrics, score_copied_names)
from components.travel.protocol import tool_response
from components.travel.tools import listing_names

RESTAURANTS = ("Restaurants in Palavi (2):\nName\tAverage Cost\tCuisines\tAggregate Rating\n"
               "Kakel Table\t96\tItalian\t2.9\nHelra Tavern\t43\tSeafood, Indian\t3.3")


def episode(*turns: str, train: bool = True) -> list[dict]:
    """System + query, a restaurant search and its result, then `turns` as assistant messages between results."""
    messages = [{"role": "system", "content": "Plan the trip."},
                {"role": "user", "content": "Three days in Palavi."},
                {"role": "assistant", "content": "<think>Kakel Table?</think><tool_call>{}</tool_call>"},
                {"role": "user", "content": tool_response(RESTAURANTS)}]
    for i, turn in enumerate(turns):
        if i:
            messages.append({"role": "user", "content": tool_response("No results.")})
        messages.append({"role": "assistant", "content": turn, "train": train})
    return messages


@pytest.fixture(scope="module")
def tokenizer():
    from components.models.tokenizer import build_tiny_tokenizer
    from components.travel.synthetic import NAME_SYLLABLES

    texts = [RESTAURANTS, "<think>I pick Kakel Table and Helra Tavern.</think>", "Plan the trip. Three days."] * 4
    return build_tiny_tokenizer(texts, vocab_size=400, name_pieces=NAME_SYLLABLES)


class Oracle:
    """A stand-in model whose greedy prediction is always the record's next token, except at `wrong` positions."""

    def __init__(self, wrong=()):
        import torch

        self.wrong, self.training = set(wrong), False
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def parameters(self):
        return iter([self.weight])

    def eval(self):
        self.training = False

    def train(self, mode=True):
        self.training = mode

    def __call__(self, input_ids, logits_to_keep):
        import torch
        from types import SimpleNamespace

        ids = input_ids[0].tolist()
        logits = torch.zeros(1, len(logits_to_keep), 8 + max(ids))
        for row, p in enumerate(logits_to_keep.tolist()):
            logits[0, row, ids[p + 1] + (1 if p + 1 in self.wrong else 0)] = 1.0
        return SimpleNamespace(logits=logits)


def test_listing_names_reads_the_first_column_of_a_listing_table_and_nothing_else():
    assert listing_names(tool_response(RESTAURANTS)) == ["Kakel Table", "Helra Tavern"]
    assert listing_names(RESTAURANTS) == ["Kakel Table", "Helra Tavern"]
    assert listing_names(tool_response("Unknown city 'Pala' (SearchRestaurant).")) == []
    assert listing_names("self-driving, from A to B, duration: 5 mins, distance: 4 km, cost: 1") == []
    # only the name column is read: a row whose other cells would not parse still names its listing
    assert listing_names(RESTAURANTS.replace("\t96\t", "\tNone\t")) == ["Kakel Table", "Helra Tavern"]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("Name\tAverage Cost\tCuisines\tAggregate Rating\nKakel 96<>/_")),
               max_size=120))
def test_listing_names_never_raises(text):
    assert isinstance(listing_names(text), list)


def test_a_copied_name_is_split_into_first_token_middle_and_last_word(tokenizer):
    ids, names = copied_names(tokenizer, episode("<think>I pick Kakel Table for dinner.</think><answer>[]</answer>"))
    assert [n.name for n in names] == ["Kakel Table"]
    name = names[0]
    assert tokenizer.decode([ids[p] for p in name.positions]) == " Kakel Table"
    assert tokenizer.decode([ids[p] for p in name.last_word]) == " Table"
    assert tokenizer.decode([ids[name.first]]).strip() == "Ka"  # the syllables of a coined name are tokens


def test_only_trained_turns_after_the_result_count(tokenizer):
    # the first assistant turn names Kakel Table before any result showed it; untrained turns are not scored
    assert copied_names(tokenizer, episode("<answer>Kakel Table</answer>", train=False))[1] == []
    _, names = copied_names(tokenizer, episode("<think>Helra Tavern, then Helra Tavern again.</think>",
                                               "<answer>Kakel Tables</answer>"))
    assert [n.name for n in names] == ["Helra Tavern", "Helra Tavern"]  # "Kakel Tables" is another word


def test_scores_by_part_with_exact_numbers():
    names = [CopiedName("Kakel Table", first=10, middle=(11,), last_word=(12,)),
             CopiedName("Helra Tavern", first=20, middle=(21, 22), last_word=(23,))]
    hit = [False] * 30
    for p in (10, 11, 20, 21, 23):
        hit[p] = True
    scores = score_copied_names([(name, hit) for name in names])
    assert scores == {"names": 2,
                      "first": {"tokens": 2, "accuracy": 1.0},
                      "middle": {"tokens": 3, "accuracy": 0.6667},
                      "last_word": {"tokens": 2, "accuracy": 0.5},
                      "whole": {"tokens": 2, "accuracy": 0.0}}
    assert score_copied_names([])["first"] == {"tokens": 0, "accuracy": None}


def test_greedy_hits_compares_the_prediction_before_each_position_with_the_token_there():
    ids = [3, 4, 5, 6, 7]
    assert greedy_hits(Oracle(), ids, [2, 4]) == [False, False, True, False, True]
    assert greedy_hits(Oracle(wrong={4}), ids, [2, 4]) == [False, False, True, False, False]
    assert greedy_hits(Oracle(), ids, [0]) == [False] * 5  # nothing predicts the first token


def test_name_copy_accuracy_over_records(tokenizer):
    record = {"messages": episode("<think>I pick Kakel Table, then Helra Tavern.</think>")}
    perfect = name_copy_accuracy(Oracle(), tokenizer, [record, {"messages": episode("<answer>[]</answer>")}])
    assert perfect["records"] == 1 and perfect["names"] == 2
    assert all(perfect[part]["accuracy"] == 1.0 for part in ("first", "last_word", "whole"))
    ids, names = copied_names(tokenizer, record["messages"])
    wrong_kind = name_copy_accuracy(Oracle(wrong=set(names[0].last_word)), tokenizer, [record])
    assert wrong_kind["last_word"]["accuracy"] == 0.5 and wrong_kind["whole"]["accuracy"] == 0.5
    assert wrong_kind["first"]["accuracy"] == 1.0
    assert name_copy_accuracy(Oracle(), tokenizer, [record], max_tokens=len(ids) - 1)["names"] == 0


@settings(max_examples=40, deadline=None)
@given(before=st.text(alphabet="abc ,.\n", max_size=12), after=st.text(alphabet="abc ,.\n", max_size=12),
       edges=st.tuples(st.sampled_from(" ,\n\""), st.sampled_from(" ,.\n\"")),
       which=st.sampled_from(["Kakel Table", "Helra Tavern"]))
def test_the_positions_of_a_copied_name_always_decode_to_text_that_holds_it(tokenizer, before, after, edges, which):
    text = f"<think>{before}{edges[0]}{which}{edges[1]}{after}</think>"
    ids, names = copied_names(tokenizer, episode(text))
    assert [n.name for n in names] == [which]
    assert which in tokenizer.decode([ids[p] for p in names[0].positions])


def test_the_first_time_a_record_writes_a_name_is_its_look_up(tokenizer):
    # turn 1 looks Kakel Table up in the result; turn 2 writes it again (it can copy turn 1) and looks Helra up
    _, names = copied_names(tokenizer, episode("<think>I pick Kakel Table.</think>",
                                               "<answer>Kakel Table, then Helra Tavern</answer>"))
    assert [(n.name, n.lookup) for n in names] == [("Kakel Table", True), ("Kakel Table", False),
                                                   ("Helra Tavern", True)]


def test_the_look_up_is_scored_apart_from_later_copies(tokenizer):
    record = {"messages": episode("<think>I pick Kakel Table.</think>", "<answer>Kakel Table</answer>")}
    ids, names = copied_names(tokenizer, record["messages"])
    looked_up = next(n for n in names if n.lookup)
    # a model that gets the look-up's first token wrong and copies its own earlier text right
    report = name_copy_accuracy(Oracle(wrong={looked_up.first}), tokenizer, [record])
    assert report["first"] == {"tokens": 2, "accuracy": 0.5}
    assert report["lookup"]["names"] == 1 and report["lookup"]["first"] == {"tokens": 1, "accuracy": 0.0}
    assert report["lookup"]["whole"]["accuracy"] == 0.0 and report["whole"]["accuracy"] == 0.5
    metrics = name_copy_metrics(report)
    assert metrics["name_copy.first"] == 0.5 and metrics["name_copy.lookup.first"] == 0.0
    assert "name_copy.records" not in metrics and "name_copy.lookup.names" not in metrics


def test_parts_with_nothing_to_score_are_not_logged():
    report = {"records": 0, **score_copied_names([]), "lookup": score_copied_names([])}
    assert name_copy_metrics(report) == {}


def test_the_copy_probe_report_prints_the_names_by_part():
    from components.models.copy_probe import format_report

    def scores(n, accuracy):
        return {"names": n, **{part: {"tokens": n, "accuracy": accuracy}
                               for part in ("first", "middle", "last_word", "whole")}}

    names = {"records": 2, **scores(7, 0.5), "lookup": scores(3, 0.25)}
    text = format_report({"records": {"examples": 2, "median_tokens": 900, "by_distance": {}, "names": names}})
    assert text == ("records: 2 examples, median 900 tokens; "
                    "7 listing names copied: first 50.0%, middle 50.0%, last word 50.0%, whole 50.0%; "
                    "first copies from a tool result (3): first 25.0%, middle 25.0%, last word 25.0%, whole 25.0%")


def test_a_tokenizer_without_character_offsets_finds_no_names_instead_of_failing(tokenizer):
    class Slow:
        is_fast = False

        def __getattr__(self, name):
            return getattr(tokenizer, name)

    messages = episode("<think>I pick Kakel Table.</think>")
    ids, names = copied_names(Slow(), messages)
    assert names == [] and ids == copied_names(tokenizer, messages)[0]
