"""The travel episode: one query, the six tools, the chat protocol.

`reset()` gives the opening messages [system, user(query text)]; `step(assistant_text)` applies one assistant turn:
a tool call gets its observation back (wrapped by `protocol.tool_response`), a malformed turn gets an error
observation saying what the format must be, and an answer ends the episode with the parsed plan in
`info["plan"]`. The env does not evaluate plans: the agent loop does, through its `evaluate` callback.
"""
from __future__ import annotations

import functools
import random
from typing import Any

from components.agent.environment import EpisodeEnded, Step
from components.agent.loop import Episode
from components.travel import protocol
from components.travel.plans import parse_plan  # the plan grammar lives with the evaluator
from components.travel.tools import TOOL_SCHEMAS, call_tool
from components.travel.world import World


@functools.lru_cache(maxsize=len(protocol.PROMPT_STYLES))
def travel_system_prompt(style: str = "full") -> str:
    """The travel episode's system message in `style` ("full" | "compact"), built once per style."""
    return protocol.system_prompt(TOOL_SCHEMAS, style=style)


def query_text(query: Any) -> str:
    """The user message of a query: a `Query`'s (or a record's) `query` field."""
    text = query.get("query") if isinstance(query, dict) else getattr(query, "query", None)
    if not isinstance(text, str) or not text.strip():
        raise ValueError("the query has no 'query' text to show the agent")
    return text


class TravelEnv:
    """One TravelPlanner episode over `world`. `failure_rate` injects transient tool failures, seeded by `seed`.

    `max_protocol_errors`: when set, the episode ends (termination "protocol_errors") at that many malformed
    turns; when None the agent loop's own limit decides. `prompt_style`: the system prompt's style; None takes
    the world's (`world.prompt_style`, from its manifest), so every stage over one world shows the same prompt.
    """

    def __init__(self, world: World, query: Any, failure_rate: float = 0.0, seed: int = 0,
                 max_protocol_errors: int | None = None, prompt_style: str | None = None):
        self.world = world
        self.prompt_style = prompt_style or getattr(world, "prompt_style", "full")
        self.query = query
        self.failure_rate = failure_rate
        self.seed = seed
        self.max_protocol_errors = max_protocol_errors
        self.reset()

    def reset(self) -> list[dict]:
        """Start (or restart) the episode; returns [system, user]."""
        self._rng = random.Random(self.seed)
        self.protocol_errors = 0
        self.done = False
        return [
            {"role": "system", "content": travel_system_prompt(self.prompt_style)},
            {"role": "user", "content": query_text(self.query)},
        ]

    def step(self, assistant_text: str) -> Step:
        """Apply one assistant turn."""
        if self.done:
            raise EpisodeEnded("the travel episode")
        turn = protocol.parse_turn(assistant_text)
        if isinstance(turn, protocol.Answer):
            return self._answer(turn)
        if isinstance(turn, protocol.ProtocolError):
            return self._protocol_error(turn)
        output = call_tool(self.world, turn.name, turn.arguments, rng=self._rng, failure_rate=self.failure_rate)
        info = {"kind": "tool", "tool": turn.name, "arguments": turn.arguments, "tool_error": not output.ok,
                "plan": None}
        return Step(protocol.tool_response(output.text), False, info)

    def _answer(self, answer: protocol.Answer) -> Step:
        plan, error = parse_plan(answer.text)
        self.done = True
        info = {"kind": "answer", "answer": answer.text, "plan": plan, "plan_error": error, "tool_error": False,
                "termination": "answer"}
        return Step(None, True, info)

    def _protocol_error(self, error: protocol.ProtocolError) -> Step:
        self.protocol_errors += 1
        info = {"kind": "protocol_error", "error": error.message, "tool_error": False, "plan": None}
        if self.max_protocol_errors is not None and self.protocol_errors >= self.max_protocol_errors:
            self.done = True
            info["termination"] = "protocol_errors"
            return Step(None, True, info)
        return Step(protocol.tool_response(f"Error: {error.message}"), False, info)


def travel_episodes(world: Any, queries: list, failure_rate: float = 0.0, seed: int = 0,
                    max_protocol_errors: int | None = None) -> list[Episode]:
    """One `TravelEnv` episode per query; `meta` carries the structured query (the expert reads it) and level."""
    episodes = []
    for query in queries:
        env = TravelEnv(world, query, failure_rate=failure_rate, seed=seed + query.idx,
                        max_protocol_errors=max_protocol_errors)
        episodes.append(Episode(idx=query.idx, env=env, meta={"query": query, "level": query.level}))
    return episodes
