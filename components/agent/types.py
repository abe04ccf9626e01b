"""The policy interface every backend implements (expert, OpenAI-compatible HTTP, transformers, vLLM)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class TurnRequest:
    """One active episode asking for its next assistant turn.

    Text backends read `messages`; token backends read `token_ids` (the whole context so far, ending with the
    generation prompt `<|im_start|>assistant\\n`).
    """

    messages: list[dict]
    token_ids: list[int] | None = None
    max_new_tokens: int = 512
    episode_id: str = ""
    meta: dict = field(default_factory=dict)


@dataclass
class TurnResult:
    """The sampled turn: `text` always; `token_ids` (ending in the end-of-turn token if the model stopped) and
    per-token `logprobs` from token backends."""

    text: str
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finished: bool = True  # False when the backend hit max_new_tokens before the end-of-turn token


class Policy(Protocol):
    """Generates the next assistant turn for every active episode of a batch in one call."""

    def generate(self, requests: list[TurnRequest]) -> list[TurnResult]: ...
