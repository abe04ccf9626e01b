"""The copy task of the tiny base's pre-training: every answer is copied from its own round's context."""
import re

import random

from components.synthesis.copy_task import CopyTaskParams, copy_records, copy_round, route_round
from components.travel.synthetic import _ATTRACTION_KINDS, _RESTAURANT_KINDS


def test_every_answer_is_a_verbatim_copy_of_its_context():
    for record in copy_records(CopyTaskParams(records=50, seed=3)):
        messages = record["messages"]
        assert messages[0]["role"] == "system" and not messages[0]["train"]
        for user, assistant in zip(messages[1::2], messages[2::2]):
            assert user["role"] == "user" and assistant["role"] == "assistant" and assistant["train"]
            if user["content"].startswith("Repeat: "):
                assert assistant["content"] == user["content"][len("Repeat: "):]
            else:
                pairs = dict(p.split(" -> ") for p in user["content"].split("\n")[0][len("Pairs: "):-1].split("; "))
                asked = user["content"].split("\n")[1][len("Look up: "):].split(", ")
                assert assistant["content"] == "; ".join(f"{k} -> {pairs[k]}" for k in asked)


def test_records_are_seeded_sized_and_fresh():
    params = CopyTaskParams(records=20, rounds=(2, 4), items=(2, 3), seed=1)
    records = copy_records(params)
    assert records == copy_records(params) and records != copy_records(params.model_copy(update={"seed": 2}))
    assert len(records) == 20 and all(5 <= len(r["messages"]) <= 9 for r in records)
    kinds = set(_RESTAURANT_KINDS + _ATTRACTION_KINDS) | {"Repeat", "Pairs", "Look"}
    names = [w for r in records for m in r["messages"][1::2] for w in re.findall(r"\b[A-Z][a-z]+\b", m["content"])
             if w not in kinds]
    assert len(set(names)) > 0.6 * len(names)  # look-up keys appear twice in their round; little else repeats
    assert copy_records(CopyTaskParams()) == []


def test_a_round_holds_between_the_requested_numbers_of_items():
    rng = random.Random(0)
    for _ in range(100):
        user, _ = copy_round(rng, (3, 3))
        first = user.split("\n")[0]
        assert first.count(", ") == 2 if first.startswith("Repeat") else first.count(" -> ") == 3


def test_a_route_round_answers_a_travel_request_with_its_origin_and_destination():
    from components.synthesis.text import OPENINGS

    rng = random.Random(4)
    openings = set()
    for _ in range(200):
        user, assistant = route_round(rng)
        org, dest = re.fullmatch(r"Route: (\w+) -> (\w+)", assistant).groups()
        assert org != dest
        opening = next(o for o in OPENINGS if re.match(re.escape(o.split("{")[0]), user))
        cue_org, cue_dest = re.search(r"(\S+ )\{org\}", opening).group(1), re.search(r"(\S+ )\{dest\}", opening).group(1)
        assert cue_org + org in user and cue_dest + dest in user  # each city follows its opening's cue word
        openings.add(opening)
    assert openings == set(OPENINGS)


def test_route_rounds_are_a_share_of_the_rounds_and_leave_other_records_unchanged():
    plain = CopyTaskParams(records=40, repeat_fraction=0.5, seed=2)
    with_routes = plain.model_copy(update={"route_fraction": 0.5})
    assert copy_records(plain) == copy_records(plain.model_copy(update={"route_fraction": 0.0}))
    users = [m["content"] for r in copy_records(with_routes) for m in r["messages"][1::2]]
    routes = sum(not u.startswith(("Repeat: ", "Pairs: ")) for u in users)
    assert 0.35 < routes / len(users) < 0.65
    assert not any(not u.startswith(("Repeat: ", "Pairs: ")) for u in
                   (m["content"] for r in copy_records(plain) for m in r["messages"][1::2]))


def test_a_recap_record_ends_with_every_answer_again_in_order():
    from components.synthesis.copy_task import RECAP, RECAP_SEPARATOR

    params = CopyTaskParams(records=30, recap_fraction=0.5, recap_rounds=(10, 12), route_fraction=0.2, seed=6)
    records = copy_records(params)
    recaps = [r for r in records if r["messages"][-2]["content"] == RECAP]
    assert 5 < len(recaps) < 25
    for record in recaps:
        answers = [m["content"] for m in record["messages"][2:-2:2]]
        assert 10 <= len(answers) <= 12 and all(m["role"] == "assistant" for m in record["messages"][2:-2:2])
        assert record["messages"][-1] == {"role": "assistant", "content": RECAP_SEPARATOR.join(answers), "train": True}
    assert copy_records(params.model_copy(update={"recap_fraction": 0.0})) == copy_records(
        CopyTaskParams(records=30, route_fraction=0.2, seed=6))  # no recaps: the same records as before recaps


def test_a_fact_round_asks_about_one_of_its_passages_and_answers_with_a_value_written_there():
    from components.synthesis.copy_task import fact_round

    rng = random.Random(4)
    for _ in range(30):
        user, assistant = fact_round(rng)
        docs, question = user.rsplit("\nQuestion: ", 1)
        assert [line[:6] for line in docs.splitlines()] == ["Doc 1(", "Doc 2(", "Doc 3("]
        value = assistant.removeprefix("Answer: ")
        assert assistant.startswith("Answer: ") and value in docs and question.endswith("?")
        # the question names one shown entity (a passage's title), and that passage holds the answer
        about = [text for title, text in re.findall(r"Doc \d\(Title: (.+?)\) (.+)", docs) if title in question]
        assert len(about) == 1 and value in about[0], (question, docs)


def test_fact_rounds_are_a_share_of_the_rounds_and_leave_records_without_them_unchanged():
    plain = copy_records(CopyTaskParams(records=30, seed=2))
    assert copy_records(CopyTaskParams(records=30, seed=2, fact_fraction=0.0)) == plain
    mixed = copy_records(CopyTaskParams(records=30, seed=2, fact_fraction=0.5))
    answers = [m["content"] for r in mixed for m in r["messages"] if m["role"] == "assistant"]
    share = sum(a.startswith("Answer: ") for a in answers) / len(answers)
    assert 0.3 < share < 0.7


def test_a_one_passage_fact_round_shows_only_the_passage_that_answers():
    from components.synthesis.copy_task import fact_round

    rng = random.Random(8)
    for _ in range(10):
        user, assistant = fact_round(rng, shown=1)
        docs, question = user.rsplit("\nQuestion: ", 1)
        title = re.match(r"Doc 1\(Title: (.+?)\) ", docs).group(1)
        assert docs.count("Doc ") == 1 and title in question and assistant.removeprefix("Answer: ") in docs


def test_observation_values_are_a_share_of_the_values_and_leave_records_without_them_unchanged():
    plain = CopyTaskParams(records=40, items=(6, 8), repeat_fraction=1.0, seed=5)
    assert copy_records(plain.model_copy(update={"observation_values": 0.0})) == copy_records(plain)
    mixed = copy_records(plain.model_copy(update={"observation_values": 0.5}))
    values = [v for r in mixed for m in r["messages"][1::2] for v in m["content"][len("Repeat: "):].split(", ")]
    observed = re.compile(r"(\d+ hours )?\d+ mins|[\d,]+ km|\d+|\d\d:\d\d|[A-Z][a-z]+ [A-Z][a-z]+")
    share = sum(bool(observed.fullmatch(v)) for v in values) / len(values)
    assert 0.4 < share < 0.75  # half drawn in an observation's form, plus the plain names that carry a kind
    assert {"mins", "km", ":"} <= {kind for v in values for kind in ("mins", "km", ":") if kind in v}
    for record in mixed:  # still verbatim copies
        for user, assistant in zip(record["messages"][1::2], record["messages"][2::2]):
            assert assistant["content"] == user["content"][len("Repeat: "):]
