"""The generated Tool-Star task set: questions over the encyclopedia whose answers are arithmetic on the years its
passages state, computation problems with known answers, deterministic generation, and the JSONL file."""
from __future__ import annotations

import json
from collections import Counter

import pytest

from components.toolstar.tasks import (
    COMPUTE_TEMPLATES,
    FACT_QUESTIONS,
    FACT_SENTENCES,
    MULTI_HOP_TEMPLATES,
    TEMPLATES,
    Fact,
    Task,
    TaskError,
    entities_by_kind,
    find_fact,
    generate_tasks,
    make_task,
    read_facts,
    read_tasks,
    write_tasks,
)


def test_the_fact_sentences_are_the_encyclopedias():
    from components.qa.corpus import RELATIONS

    for relation, sentence in FACT_SENTENCES.items():
        assert RELATIONS[relation].sentence == sentence
        assert RELATIONS[relation].question == FACT_QUESTIONS[relation]


def test_facts_are_read_from_the_passages(encyclopedia, passages):
    facts = read_facts(passages)
    for entity in encyclopedia.entities:
        for relation in FACT_SENTENCES:
            if relation in entity.facts:
                assert facts[entity.name][relation] == entity.facts[relation]
    kinds = entities_by_kind(facts)
    assert (len(kinds["town"]), len(kinds["organisation"]), len(kinds["person"])) == (60, 40, 300)


def test_a_fact_is_found_only_for_its_own_subject():
    text = "Almira was founded in the year 1200. Mira Guild was founded by Ona Vel. Mira was founded in the year 901."
    assert find_fact([text], "Mira", "town_founded") == "901"
    assert find_fact([text], "Almira", "town_founded") == "1200"
    assert find_fact([text], "Mira Guild", "org_founded") is None  # "founded by" is another relation
    assert find_fact(["Lima\nLima was founded in the year 1535."], "Lima", "town_founded") == "1535"


def test_passages_in_every_corpus_format_are_read():
    sentence = "Dunmere was founded in the year 1402."
    for passage in ({"id": "0", "title": "Dunmere", "text": sentence},
                    {"id": "0", "contents": f'"Dunmere"\n{sentence}'}):
        assert read_facts([passage]) == {"Dunmere": {"town_founded": "1402"}}
    with pytest.raises(TaskError, match="neither title/text nor contents"):
        read_facts([{"id": "0"}])


def test_a_seat_gap_task_follows_the_bridge():
    facts = {"Velmora Press": {"headquarters": "Dunmere", "org_founded": "1814"},
             "Dunmere": {"town_founded": "1402"}}
    task = make_task(TEMPLATES["seat_gap"], {"org": "Velmora Press"}, facts, "t-1")
    assert task == Task(
        id="t-1",
        question="How many years passed between the founding of the town where Velmora Press has its seat and the "
                 "establishment of Velmora Press?",
        answer="412", kind="multi_hop_arithmetic", template="seat_gap",
        facts=(Fact("Velmora Press", "headquarters", "Dunmere"), Fact("Velmora Press", "org_founded", "1814"),
               Fact("Dunmere", "town_founded", "1402")))
    assert make_task(TEMPLATES["seat_gap"], {"org": "Unknown Guild"}, facts, "t-2") is None


@pytest.mark.parametrize("template, slots, answer", [
    ("prime_sum", {"n": 100}, "1060"),
    ("gcd", {"a": 12, "b": 18}, "6"),
    ("modpow", {"a": 2, "b": 10, "m": 1000}, "24"),
    ("divisor_count", {"n": 1000}, "16"),
    ("fibonacci_mod", {"n": 10, "m": 100}, "55"),
    ("coprime_count", {"n": 10, "k": 6}, "3"),
    ("power_digit_sum", {"a": 2, "b": 15}, "26"),
    ("lcm_range", {"n": 10}, "2520"),
    ("birthplace_age", {"person": "Ona Vel", "year": 2000}, "599"),
    ("year_remainder", {"org": "Mira Guild", "m": 7}, "2"),
])
def test_answers_of_known_cases(template, slots, answer):
    facts = {"Ona Vel": {"birthplace": "Dunmere"}, "Dunmere": {"town_founded": "1401"},
             "Mira Guild": {"org_founded": "1815"}}
    assert make_task(TEMPLATES[template], slots, facts, "x").answer == answer


def test_generation_is_deterministic_balanced_and_without_repeats(passages):
    tasks = generate_tasks(passages, num_multi_hop=70, num_compute=40, seed=3)
    assert tasks == generate_tasks(passages, num_multi_hop=70, num_compute=40, seed=3)
    assert tasks != generate_tasks(passages, num_multi_hop=70, num_compute=40, seed=4)
    assert Counter(t.kind for t in tasks) == {"multi_hop_arithmetic": 70, "compute": 40}
    assert Counter(t.template for t in tasks) == {
        **{t.name: 10 for t in MULTI_HOP_TEMPLATES}, **{t.name: 5 for t in COMPUTE_TEMPLATES}}
    assert [t.id for t in tasks] == [f"toolstar-{i:05d}" for i in range(110)]
    assert len({t.question for t in tasks}) == 110
    assert all(t.answer.lstrip("-").isdigit() for t in tasks)


def test_multi_hop_facts_are_the_encyclopedias_and_compute_tasks_need_none(encyclopedia, passages):
    truth = {entity.name: entity.facts for entity in encyclopedia.entities}
    for task in generate_tasks(passages, num_multi_hop=50, num_compute=20, seed=0):
        if task.kind == "compute":
            assert task.facts == ()
            continue
        assert task.facts and all(truth[f.subject][f.relation] == f.value for f in task.facts)
        assert all(f.subject in task.question for f in task.facts[:1])


def test_a_corpus_without_the_facts_cannot_give_multi_hop_tasks():
    wiki = [{"id": "1", "contents": '"Paris"\nParis is the capital of France.'}]
    with pytest.raises(TaskError, match="star qa build"):
        generate_tasks(wiki, num_multi_hop=5, num_compute=0)
    assert len(generate_tasks(wiki, num_multi_hop=0, num_compute=5)) == 5


def test_asking_for_more_tasks_than_the_corpus_holds_says_so():
    facts = [{"title": "Dunmere", "text": "Dunmere was founded in the year 1402."},
             {"title": "Ona Vel", "text": "Ona Vel was born in Dunmere."},
             {"title": "Mira Guild", "text": "Mira Guild has its seat in Dunmere. Mira Guild was established in the "
                                              "year 1815."}]
    with pytest.raises(TaskError, match="corpus is too small"):
        generate_tasks(facts, num_multi_hop=30, num_compute=0)


def test_tasks_round_trip_through_jsonl(tmp_path, passages):
    tasks = generate_tasks(passages, num_multi_hop=7, num_compute=8, seed=1)
    path = tmp_path / "tasks.jsonl"
    assert write_tasks(path, tasks) == 15
    assert read_tasks(path) == tasks
    first = json.loads(path.read_text().splitlines()[0])
    assert set(first) == {"id", "kind", "template", "question", "answer", "facts"}


def test_a_datasets_task_keeps_its_answers_and_name_and_a_generated_one_has_neither(tmp_path):
    from components.toolstar.tasks import Task

    qa = Task(id="bamboogle-00001", question="Who?", answer="Ann", kind="qa", answers=("Ann", "Ann B."),
              dataset="bamboogle")
    generated = Task(id="toolstar-00000", question="What is 1 + 1?", answer="2", kind="compute")
    path = tmp_path / "tasks.jsonl"
    write_tasks(path, [qa, generated])
    assert read_tasks(path) == [qa, generated]
    first, second = (json.loads(line) for line in path.read_text().splitlines())
    assert first == {"id": "bamboogle-00001", "kind": "qa", "template": "", "question": "Who?", "answer": "Ann",
                     "answers": ["Ann", "Ann B."], "dataset": "bamboogle", "facts": []}
    assert "answers" not in second and "dataset" not in second
    assert qa.golden == ["Ann", "Ann B."] and generated.golden == ["2"]


@pytest.mark.parametrize("line, message", [
    ('{"id": "a", "kind": "algebra", "question": "q", "answer": "1"}', "'kind' must be one of"),
    ('{"id": "a", "kind": "qa", "question": "q", "answer": "1", "answers": ["2"]}', "'answer' '1' must be one of"),
    ('{"id": "a", "kind": "qa", "question": "q", "answer": "1", "answers": "1"}', "'answers' must be a list"),
    ('{"id": "a", "kind": "qa", "question": "q", "answer": "1", "dataset": 3}', "'dataset' must be a string"),
    ('{"id": "a", "kind": "compute", "question": "q"}', "missing field(s) answer"),
    ('{"id": "a", "kind": "compute", "question": "q", "answer": 1}', "'answer' must be a non-empty string"),
    ('{"id": "a", "kind": "compute", "question": "q", "answer": "1", "facts": [{"subject": "x"}]}', "'facts'"),
    ("[1, 2]", "a task is a JSON object"),
    ("{not json", "not valid JSON"),
])
def test_a_bad_task_line_is_named(tmp_path, line, message):
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"id": "ok", "kind": "compute", "question": "q", "answer": "1"}\n' + line + "\n")
    with pytest.raises(TaskError, match=f"tasks.jsonl:2: .*{message}".replace("(", r"\(").replace(")", r"\)")):
        read_tasks(path)


def test_duplicate_ids_and_missing_files_are_errors(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"id": "a", "kind": "compute", "question": "q", "answer": "1"}\n' * 2)
    with pytest.raises(TaskError, match="duplicate task id 'a'"):
        read_tasks(path)
    with pytest.raises(TaskError, match="does not exist"):
        read_tasks(tmp_path / "missing.jsonl")
