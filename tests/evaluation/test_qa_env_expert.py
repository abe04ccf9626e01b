"""The QA episodes (search and in-context) and the QA expert, through the shared agent loop."""
from __future__ import annotations

import re

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from components.agent.loop import Limits
from components.agent.types import TurnPolicy, TurnRequest, TurnResult
from components.answer_match import normalize_answer
from components.evaluation.ood_qa import summarize
from components.qa.corpus import PROFESSIONS, build_encyclopedia
from components.qa.env import IN_CONTEXT_EXAMPLES, InContextQAEnv, QAEnv, answer_in_passages
from components.qa.evaluate import run_qa
from components.qa.expert import QAExpertPolicy, plan_question, read_fact
from components.qa.ood import evaluate_policy
from components.retrieval import BM25Retriever
from components.syllables import NAME_SYLLABLES


@pytest.fixture(scope="module")
def book():
    return build_encyclopedia(120, 30, 20, questions_per_dataset=60, seed=3)


@pytest.fixture(scope="module")
def retriever(book):
    return BM25Retriever([p.to_dict() for p in book.passages], top_k=3)


def test_the_expert_answers_generated_questions_through_the_agent_loop(book, retriever):
    metrics = summarize(evaluate_policy(QAExpertPolicy(), book.questions, retriever, Limits(max_turns=4)))

    assert metrics["per_dataset"]["single_hop"]["em"] >= 0.95
    assert metrics["per_dataset"]["multi_hop"]["em"] >= 0.9
    assert metrics["per_dataset"]["single_hop"]["mean_tool_calls"] == pytest.approx(1.0, abs=0.1)
    assert metrics["per_dataset"]["multi_hop"]["mean_tool_calls"] == pytest.approx(2.0, abs=0.2)


def test_a_bridge_question_takes_two_searches_and_the_answer_is_read_from_the_second(book, retriever):
    question = book.questions["multi_hop"][0]
    record = run_qa([question], retriever, QAExpertPolicy(), Limits(max_turns=4), progress=False)[0]

    searches = [t["arguments"]["query"] for t in record["turns"] if t["kind"] == "tool"]
    assert len(searches) == 2 and question["hops"][1]["subject"] in searches[1]
    assert record["answer"] == question["golden_answers"][0]
    assert record["answer"] in record["messages"][-2]["content"]  # the last tool response states it
    assert record["evaluation"] == {"em": 1.0, "f1": 1.0}


def test_questions_are_decomposed_bridge_first():
    plan = plan_question("Where was the founder of Vefak Press born?")
    assert (plan.subject, plan.relations) == ("Vefak Press", ("founder", "birthplace"))
    assert plan_question("Where was Douluk Ragikrus born?").relations == ("birthplace",)
    assert plan_question("Who wrote Hamlet?") is None


def test_the_env_reports_tool_errors_and_protocol_errors_without_ending_the_episode(retriever):
    env = QAEnv("Where was Douluk Ragikrus born?", retriever)
    system, user = env.reset()
    assert '"name": "search"' in system["content"] and user["content"] == "Where was Douluk Ragikrus born?"

    unknown = env.step('<think>x</think><tool_call>{"name": "lookup", "arguments": {"q": "x"}}</tool_call>')
    empty = env.step('<think>x</think><tool_call>{"name": "search", "arguments": {"query": " "}}</tool_call>')
    broken = env.step("I think the answer is Nikrom")
    answered = env.step("<think>done</think><answer>Nikrom</answer>")

    assert (unknown.done, unknown.info["tool_error"]) == (False, True) and "only tool is search" in unknown.observation
    assert empty.info["tool_error"] and 'non-empty string argument "query"' in empty.observation
    assert broken.info["kind"] == "protocol_error" and broken.observation.startswith("<tool_response>")
    assert answered.done and answered.info["answer"] == "Nikrom"


class PassageReader(TurnPolicy):
    """A fake policy for in-context episodes: answers a single-hop question with the fact stated in the last user
    message (the passages), in the protocol's answer tags; `prose=True` answers in a sentence instead."""

    def __init__(self, prose: bool = False):
        self.prose = prose
        self.requests: list[TurnRequest] = []

    def generate(self, requests: list[TurnRequest]) -> list[TurnResult]:
        self.requests += requests
        results = []
        for request in requests:
            question = request.meta["question"]
            plan = plan_question(question)
            fact = read_fact([request.messages[-1]["content"]], plan.subject, plan.relations[0]) or "unknown"
            results.append(TurnResult(text=f"It is {fact}." if self.prose else f"<answer>{fact}</answer>"))
        return results


def test_in_context_the_retrieved_passages_are_in_the_conversation_and_one_turn_answers(book, retriever):
    questions = book.questions["single_hop"][:10] + book.questions["multi_hop"][:10]
    reader = PassageReader()

    records = run_qa(questions, retriever, reader, Limits(max_turns=4), progress=False, mode="in_context")

    assert len(reader.requests) == 20  # one turn per episode, all in one batch
    single, multi = records[:10], records[10:]
    assert all(r["num_turns"] == 1 and r["num_tool_calls"] == 0 and r["mode"] == "in_context" for r in records)
    assert [r["evaluation"]["em"] for r in single] == [1.0] * 10  # BM25 top-3 holds the asked passage
    assert all(r["answer_in_context"] for r in single)
    # a bridge question retrieves its first hop's passage; the reader answers that hop, never the question
    assert sum(r["evaluation"]["em"] for r in multi) == sum(r["answer_in_context"] for r in multi) == 0
    *opening, reply = records[0]["messages"]
    assert reply == {"role": "assistant", "content": f"<answer>{questions[0]['golden_answers'][0]}</answer>"}
    assert [m["role"] for m in opening] == ["system"] + ["user", "assistant"] * len(IN_CONTEXT_EXAMPLES) + ["user"]
    assert opening[-1]["content"].startswith("Doc 1(Title: ") and opening[-1]["content"].endswith(
        f"Question: {questions[0]['question']}")


def test_an_in_context_reply_without_answer_tags_scores_nothing_as_in_search_mode(book, retriever):
    question = book.questions["single_hop"][0]

    record = run_qa([question], retriever, PassageReader(prose=True), Limits(), progress=False, mode="in_context")[0]

    assert (record["termination"], record["answer"], record["evaluation"]) == (
        "protocol_errors", None, {"em": 0.0, "f1": 0.0})


def test_an_in_context_episode_opens_with_the_chosen_number_of_worked_examples():
    passages = [{"title": "Nor Kel", "text": "Nor Kel was born in Wel."}]
    assert len(InContextQAEnv("Where was Nor Kel born?", passages, examples=0).reset()) == 2
    two = InContextQAEnv("Where was Nor Kel born?", passages, examples=2).reset()
    assert len(two) == 6 and two[4] == {"role": "assistant", "content": f"<answer>{IN_CONTEXT_EXAMPLES[1][2]}</answer>"}
    tool_call = InContextQAEnv("q", passages).step('<tool_call>{"name": "search", "arguments": {}}</tool_call>')
    assert tool_call.done and "no tools" in tool_call.info["error"]


def _is_generated_name(word: str) -> bool:
    """Whether a word could be a generated name: syllables of NAME_SYLLABLES, then an optional "ia" (countries)."""
    syllables = "|".join(sorted(NAME_SYLLABLES, key=len, reverse=True))
    return re.fullmatch(f"(?:{syllables})+(?:ia)?", word.lower()) is not None


def test_no_worked_example_answer_can_be_the_answer_of_a_generated_question():
    assert _is_generated_name("Mirathal") and _is_generated_name("Delwaia")  # the check recognises real names
    for _, _, answer in IN_CONTEXT_EXAMPLES:
        assert not (answer.isdigit() and 800 <= int(answer) <= 1999)  # towns 800-1899, organisations 1700-1999
        assert not _is_generated_name(answer) and answer not in PROFESSIONS


def test_an_answer_is_in_the_passages_only_as_whole_words_after_normalisation():
    passages = [{"title": "Kelor", "text": "Kelor lies on the river Fenma. Kelor was founded in the year 1071."}]
    assert answer_in_passages(passages, ["fenma"]) and answer_in_passages(passages, ["the Fenma."])
    assert answer_in_passages(passages, ["nowhere", "1071"])
    assert not answer_in_passages(passages, ["Fen"]) and not answer_in_passages(passages, ["107"])
    assert not answer_in_passages(passages, [""]) and not answer_in_passages([], ["Kelor"])


_WORD = st.text(st.characters(whitelist_categories=("Lu", "Ll", "Nd")), min_size=1, max_size=12)


@given(before=st.lists(_WORD, max_size=8), answer=st.lists(_WORD, min_size=1, max_size=3),
       after=st.lists(_WORD, max_size=8))
def test_an_answer_written_into_a_passage_is_always_found(before, answer, after):
    assume(normalize_answer(" ".join(answer)))  # an answer of articles alone ("A", "the") normalises to nothing
    text = " ".join([*before, *answer, *after]) + "."
    assert answer_in_passages([{"title": "T", "text": text}], [" ".join(answer)])
