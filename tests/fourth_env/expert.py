"""The lookup game's expert: look the name up, then answer the code it read."""
from __future__ import annotations

import json

from components.agent.types import TurnPolicy, TurnRequest, TurnResult


def next_turn(messages: list[dict]) -> str:
    """Look up the name of the question, or answer with the code of the last observation."""
    last = messages[-1]["content"]
    if "<tool_response>" in last:
        return f"<think>read it</think><answer>{last.split(': ')[-1].split()[0]}</answer>"
    name = last.removeprefix("What is the code of ").rstrip("?")
    return f"<think>look it up</think><tool_call>{json.dumps({'name': 'lookup', 'arguments': {'name': name}})}</tool_call>"


class LookupExpert(TurnPolicy):
    def generate(self, requests: list[TurnRequest]) -> list[TurnResult]:
        return [TurnResult(text=next_turn(request.messages)) for request in requests]
