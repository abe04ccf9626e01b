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
    entropies: list[float] | None = None  # per-token entropies, from a backend that computes them (else None)


class Policy(Protocol):
    """Generates the next assistant turn for every active episode of a batch in one call (`generate`), or one
    decoding round of it (`generate_round`: None for a turn still being written; the agent loop calls this one).
    `reseed(seed)` restarts its sampling stream (each RL step draws from (seed, step)); `close()` frees what it holds
    (an engine process)."""

    def generate(self, requests: list[TurnRequest]) -> list[TurnResult]: ...
    def generate_round(self, requests: list[TurnRequest]) -> list[TurnResult | None]: ...
    def reseed(self, seed: int) -> None: ...
    def close(self) -> None: ...


class TurnPolicy:
    """The base of a `Policy` that writes whole turns: a round is the whole turn, and there is no sampling stream to
    reseed or resource to close. A backend that decodes in rounds, samples or holds an engine overrides them."""

    def generate(self, requests: list[TurnRequest]) -> list[TurnResult]:
        raise NotImplementedError(f"{type(self).__name__} must implement generate(requests)")

    def generate_round(self, requests: list[TurnRequest]) -> list[TurnResult | None]:
        return self.generate(requests)

    def reseed(self, seed: int) -> None:
        """Nothing to reseed (a scripted or expert policy)."""

    def close(self) -> None:
        """Nothing to close."""
