"""Stand-ins for the agent-loop tests: a character-level tokenizer with the chat special tokens, a scripted
environment and a scripted policy."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from components.agent.types import TurnPolicy, TurnRequest, TurnResult

SPECIALS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")


class CharTokenizer:
    """One id per character (its code point + 10); the chat special tokens are ids 0, 1, 2."""

    IM_END = 1

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids, i = [], 0
        while i < len(text):
            for number, special in enumerate(SPECIALS):
                if text.startswith(special, i):
                    ids.append(number)
                    i += len(special)
                    break
            else:
                ids.append(ord(text[i]) + 10)
                i += 1
        return ids

    def decode(self, ids: list[int]) -> str:
        return "".join(SPECIALS[i] if i < len(SPECIALS) else chr(i - 10) for i in ids)


@dataclass
class Step:
    observation: str | None
    done: bool
    info: dict = field(default_factory=dict)


class ScriptedEnv:
    """A tiny environment: "ANSWER" ends the episode, "BAD" is a protocol error, anything else a tool call whose
    observation echoes the call."""

    def __init__(self, observation: str = "result"):
        self.observation = observation

    def reset(self) -> list[dict]:
        return [{"role": "system", "content": "sys"}, {"role": "user", "content": "plan a trip"}]

    def step(self, text: str) -> Step:
        if text == "ANSWER":
            return Step(None, True, {"kind": "answer", "plan": [{"days": 1}], "answer": "[...]"})
        if text == "BAD":
            return Step("<tool_response>\nError: format\n</tool_response>", False,
                        {"kind": "protocol_error", "error": "format"})
        return Step(f"<tool_response>\n{self.observation} of {text}\n</tool_response>", False,
                    {"kind": "tool", "tool": "Search", "arguments": {"q": text}, "tool_error": text == "FAIL"})


class ScriptedPolicy(TurnPolicy):
    """Replies from a per-episode script (the last reply repeats); records the batch size of every call."""

    def __init__(self, scripts: dict[str, list], finished: bool = True):
        self.scripts = scripts
        self.finished = finished
        self.calls: list[list[str]] = []
        self.requests: list[TurnRequest] = []

    def generate(self, requests: list[TurnRequest]) -> list[TurnResult]:
        self.calls.append([r.episode_id for r in requests])
        self.requests.extend(requests)
        out = []
        for r in requests:
            turn = sum(1 for m in r.messages if m["role"] == "assistant")
            script = self.scripts[r.episode_id]
            reply = script[min(turn, len(script) - 1)]
            out.append(reply if isinstance(reply, TurnResult) else TurnResult(text=reply, finished=self.finished))
        return out


@pytest.fixture
def char_tokenizer() -> CharTokenizer:
    return CharTokenizer()
