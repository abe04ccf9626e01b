"""Where RL's episodes come from: the task source (`rl.env.kind`), the one seam between the trainer and an
environment.

A source says

- `items`: which records a run draws (the data cursor walks them),
- `episode(item, failure_rate, seed)`: a fresh agent-loop episode of one record (its environment and `meta`),
- `key(item)`: the record's name in episode ids,
- `evaluate(episode, record)`: the loop's `evaluate` callback, stored as the record's `evaluation`,
- `reward(record, params, progress)`: that record's `TrajectoryReward` (what the advantages use),
- `checks(records)`: per-check pass rates of a step's rollouts (MLflow `checks/*`),
- `reward_columns`: the columns of plots/rl/rewards.csv,
- `shared`: the large objects episodes share, which an ARPO branch never copies.

Two sources:

- `TravelSource` (`travel`, the default): the TravelPlanner episode (`TravelEnv` over the world), the strict
  evaluator and the STAR reward kinds;
- `ToolStarSource` (`toolstar`): one Tool-Star task per episode (`ToolStarEnv` over the QA stage's retriever and
  the bubblewrap sandbox), scored by `toolstar_rollout.score_episode` (Tool-Star's hierarchical reward: -1 for a
  format error, the answer's score, +0.1 for using both tools), with DAPO's overlong shaping when it is on.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from components.agent import loop
from components.errors import UserError
from components.evaluation.toolstar_params import ToolStarParams
from components.evaluation.toolstar_rollout import load_environment, score_episode
from components.params import load_section
from components.toolstar.env import ToolStarEnv
from components.toolstar.reward import Metric
from components.toolstar.tasks import Task, read_tasks
from components.training.rl.params import RLParams
from components.training.rl.rewards import (
    TrajectoryReward,
    check_pass_rates,
    strict_evaluation,
    toolstar_check_rates,
    toolstar_reward,
    trajectory_reward,
)
from components.travel.env import TravelEnv

# plots/rl/rewards.csv: the travel columns (the STAR reward's components), and Tool-Star's
TRAVEL_REWARD_COLUMNS = ["step", "reward", "reward_std", "task_reward", "cs_micro", "hard_micro", "cs_macro",
                         "hard_macro", "success", "format_error_rate"]
TOOLSTAR_REWARD_COLUMNS = ["step", "reward", "reward_std", "task_reward", "success", "score", "bonus", "em", "f1",
                           "format_error_rate"]


class TaskSource(Protocol):
    """What the rollout engine and the trainer need from an environment family (see the module docstring)."""

    name: str
    reward_columns: list[str]
    items: list

    @property
    def shared(self) -> tuple: ...

    def key(self, item) -> Any: ...

    def episode(self, item, failure_rate: float, seed: int) -> loop.Episode: ...

    def evaluate(self, episode: loop.Episode, record: dict) -> dict: ...

    def reward(self, record: dict, params: RLParams, progress: float) -> TrajectoryReward: ...

    def checks(self, records: Sequence[dict]) -> dict[str, float]: ...


def default_env_factory(world, query, failure_rate: float, seed: int):
    """The travel episode of docs/contracts.md."""
    return TravelEnv(world, query, failure_rate=failure_rate, seed=seed)


@dataclass
class TravelSource:
    """TravelPlanner queries over one world: the strict evaluation and the STAR reward."""

    world: Any
    items: list = field(default_factory=list)  # the RL queries (`Query`)
    env_factory: Callable = default_env_factory
    name: str = "travel"
    reward_columns: list[str] = field(default_factory=lambda: list(TRAVEL_REWARD_COLUMNS))

    @property
    def shared(self) -> tuple:
        return (self.world,)

    def key(self, query) -> int:
        return query.idx

    def episode(self, query, failure_rate: float, seed: int) -> loop.Episode:
        env = self.env_factory(self.world, query, failure_rate, seed)
        return loop.Episode(idx=query.idx, env=env, meta={"level": query.level, "query": query})

    def evaluate(self, episode: loop.Episode, record: dict) -> dict:
        return strict_evaluation(self.world, episode.meta["query"], record)

    def reward(self, record: dict, params: RLParams, progress: float) -> TrajectoryReward:
        return trajectory_reward(record, params, progress)

    def checks(self, records: Sequence[dict]) -> dict[str, float]:
        return check_pass_rates(records)


@dataclass
class ToolStarSource:
    """Tool-Star tasks answered with the search tool (`retriever`) and the Python sandbox."""

    items: list[Task]
    retriever: Any
    sandbox: Any
    max_tool_calls: int = 3
    metric: Metric = "auto"
    settings: dict = field(default_factory=dict)  # the toolstar params episodes depend on (the run's fingerprint)
    corpus: Path | None = None  # the search tool's corpus file (None: an HTTP retriever)
    name: str = "toolstar"
    reward_columns: list[str] = field(default_factory=lambda: list(TOOLSTAR_REWARD_COLUMNS))

    def __post_init__(self) -> None:
        self._index = {task.id: i for i, task in enumerate(self.items)}
        self._score = score_episode(self.metric)

    @property
    def shared(self) -> tuple:
        return (self.retriever, self.sandbox)

    def key(self, task: Task) -> str:
        return task.id

    def episode(self, task: Task, failure_rate: float, seed: int) -> loop.Episode:
        """An episode of one of `items` (its `idx`: the task's place there). `failure_rate` and `seed` are the
        travel tools' (rl.env.failure_rate must be 0 here)."""
        env = ToolStarEnv(task, self.retriever, self.sandbox, max_tool_calls=self.max_tool_calls)
        return loop.Episode(idx=self._index[task.id], env=env, meta={"task": task, "level": task.kind})

    def evaluate(self, episode: loop.Episode, record: dict) -> dict:
        return self._score(episode, record)

    def reward(self, record: dict, params: RLParams, progress: float) -> TrajectoryReward:
        return toolstar_reward(record, params)

    def checks(self, records: Sequence[dict]) -> dict[str, float]:
        return toolstar_check_rates(records)


# the params/toolstar.yaml keys an RL episode depends on (a change starts a fresh run instead of resuming)
TOOLSTAR_EPISODE_KEYS = {"max_tool_calls", "reward_metric", "retriever", "sandbox"}


def load_toolstar_source(params_path: str | Path, qa_dir: str | Path, tasks_path: str | Path,
                         max_tasks: int | None = None) -> ToolStarSource:
    """The Tool-Star source of a run: the tasks of `tasks_path` (the first `max_tasks`), the search tool over the QA
    stage's corpus in `qa_dir` (or params/toolstar.yaml's retriever) and its sandbox."""
    settings = load_section(params_path, "toolstar", ToolStarParams)
    if not Path(tasks_path).exists():
        raise UserError(f"Tool-Star task file {tasks_path} does not exist (run the `toolstar_tasks` stage: dvc repro "
                        "toolstar_tasks; pass it as --queries)")
    tasks = read_tasks(tasks_path)[:max_tasks]
    if not tasks:
        raise UserError(f"Tool-Star task file {tasks_path} holds no tasks")
    corpus = None
    if settings.retriever.kind != "http":
        corpus = Path(settings.retriever.corpus or Path(qa_dir) / "corpus.jsonl")
        if not corpus.exists():
            raise UserError(f"the search tool's corpus {corpus} does not exist (run the QA stage: dvc repro "
                            "qa_data; or pass --qa)")
    retriever, sandbox = load_environment(settings, qa_dir)
    return ToolStarSource(tasks, retriever, sandbox, max_tool_calls=settings.max_tool_calls,
                          metric=settings.reward_metric,
                          settings=settings.model_dump(mode="json", include=TOOLSTAR_EPISODE_KEYS), corpus=corpus)
