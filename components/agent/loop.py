"""The one multi-turn agent loop: the teacher, RL rollouts and evaluation all run episodes through `run_episodes`.

Every active episode is batched: one `policy.generate` call per turn carries every episode that has not finished,
so batched backends (transformers, vLLM, a thread-pooled HTTP client) see the whole batch at once. A backend that
decodes in rounds (`generate_round`: transformers with `chunk_tokens`) is called once per round instead, and an
episode whose turn ended in a round takes its environment step and starts its next turn in the next one, beside the
longer turns still being written (`generate_some_turns`). Greedy turns come out the same either way; sampled
ones draw differently, as the batches differ. The loop enforces the limits, records why each episode ended, and
builds the trajectory record of docs/contracts.md; with a tokenizer it also builds `prompt_ids`/`response_ids`/`response_mask`/`response_logprobs` from segments (see
`tokens.py`), never by re-tokenising the rendered history.

Any environment of the protocol in `environment.py` (`reset() -> messages`, `step(text) -> Step`) works: every
environment shares this loop, and each brings its own `evaluate` callback; the loop imports none of them.

`run_episodes` is built on a small public stepping API, which code that must step episodes itself (ARPO's branching
rollouts copy an episode mid-way) uses too, so there is no second loop:

    state = start_episode(episode, tokenizer)           # reset the env; EpisodeState holds messages, record, ids
    reason = limit_at_start(state, limits, tokenizer)   # an episode that cannot take a single turn
    results = generate_turns(policy, states, limits, tokenizer)   # one batched generate (next_request per state)
    results = generate_some_turns(policy, states, ...)  # or one round: a turn still being written is None
    reason = advance_episode(state, result, limits, tokenizer)    # step the env; the termination reason or None
    record = finish_episode(state, reason, tokenizer, evaluate)   # close and evaluate the trajectory record
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from tqdm.auto import tqdm

from components.agent import tokens as tok
from components.agent.environment import Environment
from components.agent.types import Policy, TurnRequest, TurnResult

TERMINATIONS = ("answer", "turn_limit", "context_limit", "token_limit", "protocol_errors")


@dataclass(frozen=True)
class Limits:
    """Per-episode limits; reaching one ends the episode with the matching termination reason."""

    max_turns: int = 60
    max_tokens_per_turn: int = 1024
    max_context_tokens: int = 32768
    max_protocol_errors: int = 3


@dataclass
class Episode:
    """One environment instance to roll out. `meta` travels to the policy in `TurnRequest.meta` (the expert reads
    `meta["query"]`) and its `level` is copied to the record."""

    idx: int
    env: Environment
    meta: dict = field(default_factory=dict)
    episode_id: str = ""

    def __post_init__(self) -> None:
        if not self.episode_id:
            self.episode_id = str(self.idx)


Evaluate = Callable[[Episode, dict], Any]


@dataclass
class EpisodeState:
    """Mutable state of one running episode: its messages, the record being built and (with a tokenizer) the token
    segments so far. A deep copy is a complete snapshot (ARPO branches from one)."""

    episode: Episode
    messages: list[dict]
    record: dict
    prompt_ids: list[int] | None = None
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] | None = field(default_factory=list)

    def context_length(self) -> int:
        """Tokens in the context so far (prompt + response segments); 0 without a tokenizer."""
        return len(self.prompt_ids or []) + len(self.response_ids)

    def after_tool_response(self) -> bool:
        """Whether the next turn is generated right after a tool response (the last turn was a tool call)."""
        turns = self.record["turns"]
        return bool(turns) and turns[-1]["kind"] == "tool"


def new_record(episode: Episode, messages: list[dict]) -> dict:
    """An empty trajectory record for an episode that just started."""
    return {
        "idx": episode.idx,
        "level": episode.meta.get("level"),
        "messages": messages,
        "turns": [],
        "termination": None,
        "plan": None,
        "answer": None,
        "evaluation": None,
        "num_turns": 0,
        "num_tool_calls": 0,
        "num_tool_errors": 0,
        "num_protocol_errors": 0,
    }


def turn_entry(info: dict) -> dict:
    """The per-turn summary kept in `record["turns"]`, from the env's step info."""
    kind = info.get("kind", "tool")
    return {
        "kind": kind,
        "tool": info.get("tool"),
        "arguments": info.get("arguments"),
        "tool_error": bool(info.get("tool_error", False)),
        "protocol_error": (info.get("error") or info.get("message")) if kind == "protocol_error" else None,
    }


def sampled_segment(tokenizer: tok.Tokenizer, result: TurnResult) -> tuple[list[int], list[float] | None]:
    """The ids the policy sampled for a turn and their logprobs: the backend's ids when it returned some, else the
    text encoded as `{text}<|im_end|>` (no logprobs then)."""
    if result.token_ids is not None:
        return list(result.token_ids), (list(result.logprobs) if result.logprobs is not None else None)
    return tok.assistant_ids(tokenizer, result.text, finished=result.finished), None


# ---- the stepping API: run_episodes is built on these, and so is anything that steps episodes itself (ARPO) ------

def start_episode(episode: Episode, tokenizer: tok.Tokenizer | None = None) -> EpisodeState:
    """Reset the episode's environment and return its running state (with the prompt ids when tokenizing)."""
    messages = [dict(m) for m in episode.env.reset()]
    state = EpisodeState(episode=episode, messages=messages, record=new_record(episode, messages))
    if tokenizer is not None:
        state.prompt_ids = tok.prompt_ids(tokenizer, messages)
    return state


def limit_at_start(state: EpisodeState, limits: Limits, tokenizer: tok.Tokenizer | None = None) -> str | None:
    """The termination reason of an episode that cannot take a single turn (its prompt fills the context, or no
    turns are allowed); None when it can start."""
    if tokenizer is not None and state.context_length() >= limits.max_context_tokens:
        return "context_limit"
    if limits.max_turns <= 0:
        return "turn_limit"
    return None


def next_request(state: EpisodeState, limits: Limits, tokenizer: tok.Tokenizer | None = None) -> TurnRequest:
    """The request for the episode's next assistant turn; with a tokenizer it carries the whole context's ids and
    asks for no more new tokens than the context has room for."""
    max_new = limits.max_tokens_per_turn
    token_ids = None
    if tokenizer is not None:
        token_ids = list(state.prompt_ids or []) + state.response_ids
        max_new = min(max_new, limits.max_context_tokens - len(token_ids))
    return TurnRequest(
        messages=state.messages,
        token_ids=token_ids,
        max_new_tokens=max_new,
        episode_id=state.episode.episode_id,
        meta=state.episode.meta,
    )


def generate_turns(policy: Policy, states: list[EpisodeState], limits: Limits,
                   tokenizer: tok.Tokenizer | None = None) -> list[TurnResult]:
    """The next turn of every state in ONE `policy.generate` call (in order)."""
    if not states:
        return []
    results = policy.generate([next_request(state, limits, tokenizer) for state in states])
    if len(results) != len(states):
        raise RuntimeError(f"policy returned {len(results)} turns for {len(states)} requests")
    return results


def generate_some_turns(policy: Policy, states: list[EpisodeState], limits: Limits,
                        tokenizer: tok.Tokenizer | None = None) -> list[TurnResult | None]:
    """One decoding round for every state (in order): the turns that ended in it, None for those still being written.

    A policy that decodes in rounds (transformers with `chunk_tokens`) returns after one round, so an episode whose
    turn ended can take its environment step and start its next turn in the following round while longer turns go
    on; a `TurnPolicy` that writes whole turns answers every turn in the round."""
    if not states:
        return []
    results = policy.generate_round([next_request(state, limits, tokenizer) for state in states])
    if len(results) != len(states):
        raise RuntimeError(f"policy returned {len(results)} turns for {len(states)} requests")
    return results


def _append_sampled(state: EpisodeState, tokenizer: tok.Tokenizer, result: TurnResult) -> None:
    ids, logprobs = sampled_segment(tokenizer, result)
    state.response_ids.extend(ids)
    state.response_mask.extend([1] * len(ids))
    if state.response_logprobs is not None:
        if logprobs is None or len(logprobs) != len(ids):
            state.response_logprobs = None
        else:
            state.response_logprobs.extend(logprobs)


def _append_observation(state: EpisodeState, tokenizer: tok.Tokenizer, observation: str) -> None:
    ids = tok.tool_segment_ids(tokenizer, observation)
    state.response_ids.extend(ids)
    state.response_mask.extend([0] * len(ids))
    if state.response_logprobs is not None:
        state.response_logprobs.extend([0.0] * len(ids))


def advance_episode(state: EpisodeState, result: TurnResult, limits: Limits,
                    tokenizer: tok.Tokenizer | None = None) -> str | None:
    """Apply one sampled turn (step the environment, update the record and token segments); return the termination
    reason if the episode ended, else None."""
    record = state.record
    state.messages.append({"role": "assistant", "content": result.text})
    record["num_turns"] += 1
    if tokenizer is not None:
        _append_sampled(state, tokenizer, result)
    if not result.finished:
        # The turn was cut at the per-turn token limit: it is not parsed (it would be a silent truncation).
        record["turns"].append({"kind": "truncated", "tool": None, "arguments": None, "tool_error": False,
                                "protocol_error": None})
        return "token_limit"
    step = state.episode.env.step(result.text)
    info = dict(step.info or {})
    entry = turn_entry(info)
    record["turns"].append(entry)
    if entry["kind"] == "tool":
        record["num_tool_calls"] += 1
        record["num_tool_errors"] += int(entry["tool_error"])
    elif entry["kind"] == "protocol_error":
        record["num_protocol_errors"] += 1
    if step.done:
        record["plan"] = info.get("plan")
        record["answer"] = info.get("answer")
        return info.get("termination", "answer")
    if step.observation is not None:
        state.messages.append({"role": "user", "content": step.observation})
        if tokenizer is not None:
            _append_observation(state, tokenizer, step.observation)
    if record["num_protocol_errors"] >= limits.max_protocol_errors:
        return "protocol_errors"
    if record["num_turns"] >= limits.max_turns:
        return "turn_limit"
    if tokenizer is not None and state.context_length() >= limits.max_context_tokens:
        return "context_limit"
    return None


def finish_episode(state: EpisodeState, termination: str, tokenizer: tok.Tokenizer | None = None,
                   evaluate: Evaluate | None = None) -> dict:
    """Close the record: the termination reason, the token fields (with a tokenizer) and the evaluation."""
    record = state.record
    record["termination"] = termination
    if tokenizer is not None:
        record["prompt_ids"] = list(state.prompt_ids or [])
        record["response_ids"] = state.response_ids
        record["response_mask"] = state.response_mask
        record["response_logprobs"] = state.response_logprobs
    if evaluate is not None:
        record["evaluation"] = evaluate(state.episode, record)
    return record


def run_episodes(
    episodes: list[Episode],
    policy: Policy,
    limits: Limits = Limits(),
    tokenizer: tok.Tokenizer | None = None,
    evaluate: Evaluate | None = None,
    on_finished: Callable[[dict], None] | None = None,
    progress: bool = True,
) -> list[dict]:
    """Roll out every episode with `policy`, batched, and return their trajectory records in input order.

    `evaluate(episode, record)` fills `record["evaluation"]` when an episode ends; `on_finished(record)` is called
    right after (the teacher appends the record to its output there, so a crash loses no finished trajectory).
    """
    records: list[dict | None] = [None] * len(episodes)
    active: list[tuple[int, EpisodeState]] = []
    bar = tqdm(total=len(episodes), desc="episodes", unit="ep", disable=not progress)

    def finish(position: int, state: EpisodeState, reason: str) -> None:
        records[position] = finish_episode(state, reason, tokenizer, evaluate)
        if on_finished is not None:
            on_finished(records[position])
        bar.update(1)

    for position, episode in enumerate(episodes):
        state = start_episode(episode, tokenizer)
        reason = limit_at_start(state, limits, tokenizer)
        if reason is None:
            active.append((position, state))
        else:
            finish(position, state, reason)
    try:
        while active:
            results = generate_some_turns(policy, [state for _, state in active], limits, tokenizer)
            still_active = []
            for (position, state), result in zip(active, results):
                if result is None:  # its turn goes on in the next round
                    still_active.append((position, state))
                    continue
                reason = advance_episode(state, result, limits, tokenizer)
                if reason is None:
                    still_active.append((position, state))
                else:
                    finish(position, state, reason)
            active = still_active
    finally:
        bar.close()
    return [r for r in records if r is not None]
