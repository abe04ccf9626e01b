"""Validation on TravelPlanner queries: a policy through the shared agent loop on the validation queries, every plan
scored with both evaluator modes (official and strict).

Outputs: per-query records (the trajectory, the plan, every check with its reason), the metrics
`{"n", "strict": {...}, "official": {...}}` plus termination, tool-call and per-level statistics, and the TravelPlanner
leaderboard submission lines. Models that answer in prose get their plan extracted by an OpenAI-compatible formatter
endpoint (TravelPlanner's "parsing" step) before scoring. The validate stage (components/evaluation/validate.py)
loads the checkpoint and reaches this module through the environment registry.
"""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Literal

from pydantic import Field

from components.agent.http import EndpointConfig, OpenAIChatClient
from components.agent.loop import Episode, Limits, run_episodes
from components.agent.params import DecodingParams, LimitsParams
from components.errors import UserError
from components.params import Params
from components.travel.env import travel_episodes
from components.travel.evaluate import COMMONSENSE_CHECKS, HARD_CHECKS, evaluate_plan
from components.travel.metrics import summarize
from components.travel.plans import parse_plan
from components.travel.tasks import level_stratified_prefix, load_queries
from components.travel.world import World

MODES = ("strict", "official")


class FormatterParams(Params):
    """The prose-plan formatter: an OpenAI-compatible endpoint that turns a prose answer into a JSON plan."""

    base_url: str | None = None
    model: str = "gpt-4o-mini"
    api_key_env: str | None = "OPENAI_API_KEY"
    max_tokens: int = Field(2048, ge=1)


class ValidateParams(Params):
    """params/validate.yaml, section `validate`."""

    limits: LimitsParams = LimitsParams(max_turns=30, max_tokens_per_turn=384, max_context_tokens=8192)
    decoding: DecodingParams = DecodingParams()
    failure_rate: float = Field(0.0, ge=0.0, le=1.0)  # the env's injected tool failures (0 for validation)
    max_queries: int | None = Field(None, ge=1)
    answer_format: Literal["json", "prose"] = "json"
    formatter: FormatterParams = FormatterParams()
    submission: str | None = None  # path of the leaderboard submission file to write (test-set queries)


# --- scoring ----------------------------------------------------------------------------------------------------

def evaluate_both_modes(world, query, plan) -> dict:
    """`{"strict": PlanEvaluation, "official": PlanEvaluation}` for one plan (None when nothing was delivered)."""
    return {mode: evaluate_plan(world, query, plan, mode=mode) for mode in MODES}


def summarize_mode(queries: list, evaluations: list) -> dict:
    """The set metrics of one evaluator mode (the contract's six metrics, per_check, by_level, by_days)."""
    return summarize(queries, evaluations)


def termination_stats(records: list[dict]) -> dict:
    """How episodes ended: counts and rates per termination reason."""
    counts = Counter(r["termination"] for r in records)
    n = max(1, len(records))
    return {"counts": dict(counts), "rates": {k: v / n for k, v in counts.items()}}


def tool_call_stats(records: list[dict]) -> dict:
    """Tool-call statistics: calls per episode, error rate, protocol errors, calls per tool."""
    n = max(1, len(records))
    calls = sum(r["num_tool_calls"] for r in records)
    per_tool = Counter(t["tool"] for r in records for t in r["turns"] if t["kind"] == "tool")
    return {
        "mean_tool_calls": calls / n,
        "mean_turns": sum(r["num_turns"] for r in records) / n,
        "tool_error_rate": sum(r["num_tool_errors"] for r in records) / max(1, calls),
        "mean_protocol_errors": sum(r["num_protocol_errors"] for r in records) / n,
        "per_tool": dict(sorted(per_tool.items(), key=lambda kv: str(kv[0]))),
    }


def by_level(records: list[dict]) -> dict:
    """Final pass rate per difficulty level and evaluator mode."""
    levels: dict[str, list[dict]] = {}
    for record in records:
        levels.setdefault(str(record.get("level")), []).append(record)
    return {
        level: {"n": len(rs), **{f"final_pass_{mode}": sum(bool(r["evaluation"][mode]["final_pass"]) for r in rs)
                                 / len(rs) for mode in MODES}}
        for level, rs in sorted(levels.items())
    }


_FLIGHT_NUMBER = re.compile(r"\bF\d+\b")
_NAMED_FIELDS = ("breakfast", "lunch", "dinner", "accommodation")


def plan_entities(plan: list[dict] | None) -> list[str]:
    """The names a plan commits to: restaurants, attractions, accommodations ("Name, City" -> Name) and flights."""
    entities = []
    for day in plan or []:
        if not isinstance(day, dict):
            continue
        values = [str(day.get(key) or "") for key in _NAMED_FIELDS] + str(day.get("attraction") or "").split(";")
        entities += [v.rsplit(",", 1)[0].strip() for v in values if v.strip() not in ("", "-")]
        entities += _FLIGHT_NUMBER.findall(str(day.get("transportation") or ""))
    return [e for e in entities if e]


def grounding(record: dict) -> float | None:
    """Share of the plan's entities that appear in the episode's tool observations (None without entities):
    a correct entity the agent never read was memorised, not grounded."""
    entities = plan_entities(record.get("plan"))
    if not entities:
        return None
    observations = "\n".join(m["content"] for m in record["messages"][2:] if m["role"] != "assistant")
    return sum(entity in observations for entity in entities) / len(entities)


def grounding_stats(records: list[dict]) -> dict:
    """Mean grounding over the plans that name any entity, and how many did."""
    values = [g for g in map(grounding, records) if g is not None]
    return {"mean": sum(values) / len(values) if values else None, "plans_with_entities": len(values)}


def first_call_origin(queries: list, records: list[dict]) -> dict:
    """How often the first tool call names the query's origin exactly, over the episodes whose first call has a
    `departure` argument (a flight or route search): the one copy in an episode that picks a name out of the query
    by its cue word ("departing from") rather than copying the text just before it.
    `{"n", "exact"}`; exact is None when no episode made such a call."""
    hits = []
    for query, record in zip(queries, records):
        first = next((t for t in record["turns"] if t["kind"] == "tool"), None)
        arguments = first.get("arguments") if first else None
        if isinstance(arguments, dict) and "departure" in arguments:
            hits.append(str(arguments["departure"]).strip() == query.org)
    return {"n": len(hits), "exact": sum(hits) / len(hits) if hits else None}


def validation_metrics(queries: list, records: list[dict], evaluations: dict[str, list]) -> dict:
    """The validate stage's metrics file: `{"n", "strict", "official", "termination", "tool_calls", "by_level",
    "grounding", "first_call_origin"}`."""
    return {
        "n": len(queries),
        **{mode: summarize_mode(queries, evaluations[mode]) for mode in MODES},
        "termination": termination_stats(records),
        "tool_calls": tool_call_stats(records),
        "by_level": by_level(records),
        "grounding": grounding_stats(records),
        "first_call_origin": first_call_origin(queries, records),
    }


# --- the prose-plan formatter -----------------------------------------------------------------------------------

FORMATTER_INSTRUCTIONS = """Convert the travel plan below into a JSON list with one object per day. Each object has \
exactly these keys: "days" (1, 2, ...), "current_city", "transportation", "breakfast", "attraction", "lunch", \
"dinner", "accommodation". Use "from A to B" in current_city on travel days, "-" for an empty field, "Name, City" \
for restaurants, attractions (";"-separated) and accommodations, and keep flight numbers as written \
("Flight Number: F0123456, from A to B, Departure Time: 08:00, Arrival Time: 10:00"). Answer with the JSON list only.

Query: {query}

Plan:
{text}"""


def formatter_messages(query_text: str, answer_text: str) -> list[dict]:
    """The chat request asking the formatter to turn a prose answer into a JSON plan."""
    return [{"role": "user", "content": FORMATTER_INSTRUCTIONS.format(query=query_text, text=answer_text)}]


def final_answer_text(record: dict) -> str | None:
    """The text inside the last assistant turn's `<answer>` (or the whole turn when it has no tags)."""
    assistants = [m["content"] for m in record["messages"] if m["role"] == "assistant"]
    if not assistants:
        return None
    text = assistants[-1]
    if "<answer>" in text:
        text = text.split("<answer>", 1)[1].split("</answer>", 1)[0]
    return text.strip() or None


class ProsePlanFormatter:
    """Extracts a JSON plan from a prose answer through an OpenAI-compatible chat endpoint."""

    def __init__(self, params: FormatterParams, transport=None):
        if not params.base_url:
            raise UserError("validate.answer_format is prose but validate.formatter.base_url is not set "
                            "(an OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1)")
        self.params = params
        self.client = OpenAIChatClient(EndpointConfig(base_url=params.base_url, model=params.model,
                                                      api_key_env=params.api_key_env), transport=transport)

    def __call__(self, query_text: str, answer_text: str) -> tuple[list | None, str | None]:
        """(plan, None) or (None, why not)."""
        result = self.client.complete(formatter_messages(query_text, answer_text), self.params.max_tokens)
        return parse_plan(result.text)


# --- running ----------------------------------------------------------------------------------------------------

def run_validation(world, queries: list, policy, limits: Limits, tokenizer=None, failure_rate: float = 0.0,
                   seed: int = 0, formatter=None, progress: bool = True) -> tuple[list[dict], dict]:
    """Roll out `policy` on every query, score each plan in both modes; return (records, metrics).

    With a `formatter`, an episode that ended with an answer whose plan did not parse gets its plan from the
    formatter (the record keeps `plan_source: "formatter"` and the formatter's error, if any).
    """
    by_idx = {q.idx: q for q in queries}

    def plan_of(record: dict):
        if record["plan"] is None and formatter is not None and record["termination"] == "answer":
            text = final_answer_text(record)
            if text:
                plan, error = formatter(by_idx[record["idx"]].query, text)
                record["plan"], record["plan_source"], record["formatter_error"] = plan, "formatter", error
        return record["plan"]

    evaluated: dict[int, dict] = {}

    def evaluate(episode: Episode, record: dict) -> dict:
        # An answer whose plan cannot be parsed is scored as text: the evaluator counts it as not delivered
        # and fails every check with the parser's reason.
        plan = plan_of(record)
        scored = plan if plan is not None else record.get("answer")
        evaluated[record["idx"]] = evaluate_both_modes(world, episode.meta["query"], scored)
        return {mode: evaluation.to_dict() for mode, evaluation in evaluated[record["idx"]].items()}

    records = run_episodes(travel_episodes(world, queries, failure_rate, seed), policy, limits=limits,
                           tokenizer=tokenizer, evaluate=evaluate, progress=progress)
    evaluations = {mode: [evaluated[r["idx"]][mode] for r in records] for mode in MODES}
    return records, validation_metrics([by_idx[r["idx"]] for r in records], records, evaluations)


def submission_lines(queries: list, records: list[dict]) -> list[dict]:
    """TravelPlanner leaderboard submission: one `{"idx", "query", "plan"}` line per query, in query order
    (idx 1-based as in the leaderboard's files; an undelivered plan is null)."""
    plans = {r["idx"]: r["plan"] for r in records}
    return [{"idx": position, "query": q.query, "plan": plans.get(q.idx)}
            for position, q in enumerate(queries, start=1)]


def load_validation_set(world_dir: str | Path, queries_path: str | Path,
                        max_queries: int | None = None) -> tuple[World, list]:
    """(world, queries): the world of `world_dir` and the first `max_queries` queries of `queries_path`."""
    return World.load(world_dir), load_queries(queries_path)[:max_queries]
