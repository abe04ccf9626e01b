"""The environment protocol: what every environment (travel, toolstar, qa, and any added one) implements, and the
one `Step` type its `step` returns. The agent loop knows environments only through this protocol.

    messages = env.reset()              # start (or restart) the episode: the opening messages [system, user]
    step = env.step(assistant_text)     # one assistant turn -> Step(observation, done, info)

`step` never raises on a bad turn: a malformed turn is an observation telling the model the format (`info["kind"]`
"protocol_error"). The episode ends when a step returns `done=True` (`info["termination"]` says why; the loop records
`info["plan"]`/`info["answer"]`). Stepping an ended episode is a bug in the caller, so every environment raises
`EpisodeEnded` then; `reset()` starts the episode again.

`info["kind"]` is the turn's kind the loop counts: "tool" (a tool call; `tool`, `arguments`, `tool_error`),
"protocol_error" (`error`: what was wrong), "answer", or an environment's own kind (counted as neither).

An observation that reports the turn's own mistake (a malformed turn, a bad or missing argument, an unknown tool or
name, a call over a limit) starts with `Error:` (travel's unknown city or state: `Unknown city '…`/`Unknown state
'…`), inside the environment's `<tool_response>` wrapper or bare: `is_turn_error`. SFT never trains such a turn
(`trained_turn`), only what follows it.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from components.params import Params


@dataclass
class Step:
    """The result of one assistant turn: the next user-role observation (None when done), done, info."""

    observation: str | None
    done: bool
    info: dict = field(default_factory=dict)


class EpisodeEnded(RuntimeError):
    """`step` was called after the episode ended."""

    def __init__(self, environment: str = "the environment"):
        super().__init__(f"{environment}'s episode has ended: call reset() before stepping it again")


class Environment(Protocol):
    """One episode of an environment (see the module docstring)."""

    def reset(self) -> list[dict]: ...

    def step(self, assistant_text: str) -> Step: ...


# ---- which assistant turns SFT trains (the sft_data stage's, and every expert's SFT records) ----------------------

TURN_ERROR_PREFIXES = ("Error:", "Unknown city '", "Unknown state '")
TRANSIENT_FAILURE = "temporarily unavailable"  # an injected service failure: retrying the same call is right


def is_turn_error(observation: str) -> bool:
    """Whether an observation reports a mistake in the turn it answers (see the module docstring), as opposed to a
    tool's result, an empty one ("There is no flight …") included, or a transient failure."""
    text = observation.strip()
    if text.startswith("<tool_response>"):
        text = text[len("<tool_response>"):].strip()
    return text.startswith(TURN_ERROR_PREFIXES) and TRANSIENT_FAILURE not in text


def trained_turn(messages: list[dict], index: int) -> bool:
    """Whether SFT trains message `index`: an assistant turn, unless the environment's next message reports it as a
    mistake (`is_turn_error`). Such a turn stays in the context, so the model learns the recovery that follows it,
    never the mistake."""
    if messages[index]["role"] != "assistant":
        return False
    following = messages[index + 1] if index + 1 < len(messages) else None
    return not (following is not None and following["role"] == "user" and is_turn_error(following["content"]))


# ---- what the stages need from an environment beyond one episode (the registry, components/environments.py) ------

@dataclass(frozen=True)
class TaskReward:
    """The environment's reward of one finished episode: `value` (what RL's advantages start from), the reward
    kind used, its named `components` (columns of plots/rl/rewards.csv; every environment has `success`, 1.0 when
    the episode solved its task, which the trainer's progress and summary report) and whether the format reward
    replaced the task reward (a trajectory that broke the protocol)."""

    value: float
    kind: str
    components: dict[str, float]
    format_applied: bool


class RewardParams(Params):
    """The base of an environment's `rl.reward` params (its source module's `REWARD_PARAMS`): every environment
    names the kind of reward a run trains on."""

    kind: str


@dataclass(frozen=True)
class SourceInputs:
    """Where an environment's task source reads its records and its other inputs.

    `tasks`: the task file (travel: a query JSONL; toolstar: a task JSONL); `files`: the environment's other inputs
    by name (travel: "world"; toolstar: "qa", the search corpus folder, and "params", params/toolstar.yaml);
    `max_items`: the first N records only; `failure_rate`: injected tool failures; `reward`: the RL reward settings
    (`rl.reward`, parsed as the environment's own `REWARD_PARAMS`; None: its defaults); `full_evaluation`: `evaluate` scores every
    mode the environment has, not only what its reward reads (travel: the official evaluator beside the strict
    one; an environment with one mode has nothing more to add)."""

    tasks: Path
    files: dict[str, Path | None] = field(default_factory=dict)
    max_items: int | None = None
    failure_rate: float = 0.0
    reward: RewardParams | None = None
    full_evaluation: bool = False


class TaskSource(Protocol):
    """An environment's records and how RL rolls them out and scores them (one per `env.kind`).

    `items`: the records a run draws; `key(item)`: a record's name in episode ids; `episode(item, seed)`: a fresh
    episode (its environment and `meta`); `evaluate(episode, record)`: the agent loop's evaluate callback, stored as
    the record's `evaluation`; `reward(record, progress)`: its `TaskReward` at training progress in [0, 1];
    `checks(records)`: per-check pass rates of a step's rollouts; `reward_columns`: plots/rl/rewards.csv's columns;
    `shared`: the large objects episodes share (an ARPO branch never copies them); `fingerprint(params)`: the
    params and input files a run's checkpoints are keyed on (a change starts a fresh run).

    Greedy evaluation on held-out records (`rl.eval`): `summary(records)` gives the set metrics of evaluated
    records, keyed by `eval_metrics` (MLflow `eval/<name>`) and `eval_checks` (`eval/checks/<name>`); the two lists
    in that order are plots/rl/eval.csv's columns after `step`; `held_out(tasks, max_items)` is the same
    environment over another task file (the first `max_items` records), sharing this source's large objects, with no
    injected failures."""

    kind: str
    items: list
    reward_columns: list[str]
    eval_metrics: list[str]
    eval_checks: list[str]

    @property
    def shared(self) -> tuple: ...

    def key(self, item: Any) -> Any: ...

    def episode(self, item: Any, seed: int) -> Any: ...

    def evaluate(self, episode: Any, record: dict) -> dict: ...

    def reward(self, record: dict, progress: float) -> TaskReward: ...

    def checks(self, records: Sequence[dict]) -> dict[str, float]: ...

    def summary(self, records: Sequence[dict]) -> dict[str, float | None]: ...

    def held_out(self, tasks: Path, max_items: int | None) -> "TaskSource": ...

    def fingerprint(self, params: dict) -> tuple[dict, dict[str, Path | None]]: ...
