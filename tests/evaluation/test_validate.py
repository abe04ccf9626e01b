"""Validation of a checkpoint on travel queries: both evaluator modes, statistics, reproducibility, submission."""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from components.agent.loop import Limits
from components.agent.types import TurnPolicy, TurnResult
from components.agent.params import LimitsParams
from components.evaluation.validate import validate_checkpoint
from components.travel.tasks import dump_queries
from components.travel.validation import (
    FormatterParams, ProsePlanFormatter, ValidateParams, first_call_origin, grounding, plan_entities, run_validation,
    submission_lines,
)


class ScriptedPolicy(TurnPolicy):
    """A text policy that answers every episode at once with the same text."""

    def __init__(self, text: str):
        self.text = text

    def generate(self, requests):
        return [TurnResult(text=self.text) for _ in requests]


def test_metrics_have_the_contract_shape_for_both_modes(tiny_world, make_queries):
    queries = make_queries(tiny_world)
    plan = [{"days": 1, "current_city": f"from {queries[0].org} to {queries[0].dest}", "transportation": "-",
             "breakfast": "-", "attraction": "-", "lunch": "-", "dinner": "-", "accommodation": "-"}]
    policy = ScriptedPolicy(f"<think>done</think><answer>{json.dumps(plan)}</answer>")

    records, metrics = run_validation(tiny_world, queries, policy, Limits(max_turns=2), progress=False)

    assert metrics["n"] == 2
    for mode in ("strict", "official"):
        assert metrics[mode]["delivery_rate"] == 1.0 and metrics[mode]["final_pass"] == 0.0
        assert set(metrics[mode]["per_check"]) >= {"is_not_absent", "valid_cost"}
        assert records[0]["evaluation"][mode]["commonsense"]["is_not_absent"]["status"] == "fail"
        assert records[0]["evaluation"][mode]["commonsense"]["is_not_absent"]["reason"]  # says why
    assert metrics["termination"]["counts"] == {"answer": 2}
    assert metrics["tool_calls"]["mean_tool_calls"] == 0.0
    assert metrics["by_level"] == {"easy": {"n": 2, "final_pass_strict": 0.0, "final_pass_official": 0.0}}


def test_a_prose_answer_gets_its_plan_from_the_formatter_endpoint(tiny_world, make_queries):
    queries = make_queries(tiny_world, n=1)
    plan = [{"days": 1, "current_city": queries[0].dest, "transportation": "-", "breakfast": "-",
             "attraction": "-", "lunch": "-", "dinner": "-", "accommodation": "-"}]
    asked = []

    def endpoint(request: httpx.Request) -> httpx.Response:
        asked.append(json.loads(request.content)["messages"][0]["content"])
        return httpx.Response(200, json={"choices": [{"message": {"content": "```json\n" + json.dumps(plan)
                                                                  + "\n```"}, "finish_reason": "stop"}]})

    formatter = ProsePlanFormatter(FormatterParams(base_url="http://formatter/v1", api_key_env=None),
                                   transport=httpx.MockTransport(endpoint))
    policy = ScriptedPolicy("<think>ok</think><answer>Day 1: stay in town and relax.</answer>")

    records, metrics = run_validation(tiny_world, queries, policy, Limits(max_turns=2), formatter=formatter,
                                      progress=False)

    assert "Day 1: stay in town and relax." in asked[0] and queries[0].query in asked[0]
    assert records[0]["plan"] == plan and records[0]["plan_source"] == "formatter"
    assert metrics["strict"]["delivery_rate"] == 1.0


def test_the_leaderboard_submission_has_one_line_per_query_in_order(tiny_world, make_queries):
    queries = make_queries(tiny_world)
    records = [{"idx": 1, "plan": [{"days": 1}]}, {"idx": 0, "plan": None}]
    assert submission_lines(queries, records) == [
        {"idx": 1, "query": queries[0].query, "plan": None},
        {"idx": 2, "query": queries[1].query, "plan": [{"days": 1}]}]


def test_a_saved_checkpoint_validates_identically_twice_with_the_same_seed(tiny_checkpoint, tiny_world, make_queries,
                                                                           tiny_world_dir, tmp_path: Path):
    queries_path = dump_queries(make_queries(tiny_world), tmp_path / "val.jsonl")
    params = ValidateParams(limits=LimitsParams(max_turns=2, max_tokens_per_turn=16, max_context_tokens=4096),
                            decoding={"temperature": 1.0, "seed": 3})

    _, first_records, first = validate_checkpoint(tiny_checkpoint, tiny_world_dir, queries_path, params)
    _, second_records, second = validate_checkpoint(tiny_checkpoint, tiny_world_dir, queries_path, params)

    assert first == second
    assert [r["messages"] for r in first_records] == [r["messages"] for r in second_records]
    assert first_records[0]["response_ids"] and len(first_records[0]["response_mask"]) == len(
        first_records[0]["response_ids"])
    assert first["n"] == 2 and first["strict"]["final_pass"] == 0.0  # an untrained model plans nothing
    assert sum(first["termination"]["counts"].values()) == 2


def test_grounding_counts_the_plan_entities_the_agent_read_in_an_observation():
    plan = [{"days": 1, "current_city": "from A to B",
             "transportation": "Flight Number: F0123, from A to B, Departure Time: 08:00, Arrival Time: 09:00",
             "breakfast": "-", "attraction": "Old Mill, B;Sky Tower, B;", "lunch": "Cafe Rosa, B",
             "dinner": "Invented Diner, B", "accommodation": "Blue House, B"}]
    record = {"plan": plan, "messages": [
        {"role": "system", "content": "tools"}, {"role": "user", "content": "plan a trip"},
        {"role": "assistant", "content": "Invented Diner"},  # the agent's own words do not count
        {"role": "user", "content": "<tool_response>F0123 ... Old Mill ... Sky Tower ... Cafe Rosa</tool_response>"},
    ]}

    assert plan_entities(plan) == ["Cafe Rosa", "Invented Diner", "Blue House", "Old Mill", "Sky Tower", "F0123"]
    assert grounding(record) == pytest.approx(4 / 6)
    assert grounding({"plan": None, "messages": []}) is None


def test_first_call_origin_counts_first_calls_whose_departure_is_the_query_origin_exactly(tiny_world, make_queries):
    queries = make_queries(tiny_world, 4)

    def record(*turns):
        return {"turns": [{"kind": kind, "tool": None, "arguments": arguments} for kind, arguments in turns]}
    records = [
        record(("tool", {"departure": queries[0].org, "destination": "X", "date": "2022-03-01"})),
        record(("protocol_error", None), ("tool", {"departure": "Corlavi", "destination": "X"})),  # one syllable off
        record(("tool", {"city": queries[2].org}), ("tool", {"departure": queries[2].org})),  # first call: no departure
        record(),  # no tool call at all
    ]

    assert first_call_origin(queries, records) == {"n": 2, "exact": 0.5}
    assert first_call_origin(queries[:1], [record()]) == {"n": 0, "exact": None}


def test_neither_an_answer_that_is_no_plan_nor_no_answer_is_delivered(tiny_world, make_queries):
    queries = make_queries(tiny_world)
    answered, _ = run_validation(tiny_world, queries[:1], ScriptedPolicy("<think>x</think><answer>no idea</answer>"),
                                 Limits(max_turns=2), progress=False)
    silent, metrics = run_validation(tiny_world, queries[:1], ScriptedPolicy("<think>hmm</think>"),
                                     Limits(max_turns=2, max_protocol_errors=1), progress=False)

    assert answered[0]["plan"] is None and answered[0]["evaluation"]["strict"]["delivered"] is False
    assert "no plan delivered" in answered[0]["evaluation"]["strict"]["commonsense"]["is_not_absent"]["reason"]
    assert answered[0]["evaluation"]["strict"]["final_pass"] is False
    assert silent[0]["termination"] == "protocol_errors" and metrics["strict"]["delivery_rate"] == 0.0
