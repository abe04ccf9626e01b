"""The QA episode and the QA expert, through the shared agent loop."""
from __future__ import annotations


import pytest

from components.agent.loop import Limits
from components.evaluation.ood_qa import evaluate_policy
from components.qa.corpus import build_encyclopedia
from components.qa.env import QAEnv
from components.qa.expert import QAExpertPolicy, plan_question
from components.retrieval import BM25Retriever
from components.qa.evaluate import run_qa


@pytest.fixture(scope="module")
def book():
    return build_encyclopedia(120, 30, 20, questions_per_dataset=60, seed=3)


@pytest.fixture(scope="module")
def retriever(book):
    return BM25Retriever([p.to_dict() for p in book.passages], top_k=3)


def test_the_expert_answers_generated_questions_through_the_agent_loop(book, retriever):
    metrics = evaluate_policy(QAExpertPolicy(), book.questions, retriever, Limits(max_turns=4))

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
