"""The Tool-Star environment's task source (`env.kind: toolstar`): one task per episode (`ToolStarEnv` over the
QA stage's retriever and the bubblewrap sandbox), scored by `evaluate.score_episode` (Tool-Star's hierarchical
reward: -1 for a format error, the answer's score, +0.1 for using both tools).

    source = load_source(SourceInputs(tasks=Path("data/toolstar/sft.jsonl"),
                                      files={"qa": Path("data/qa"), "params": Path("params/toolstar.yaml")}))
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from components.agent.environment import RewardParams as EnvironmentRewardParams
from components.agent.environment import SourceInputs, TaskReward
from components.agent.loop import Episode
from components.errors import UserError
from components.params import load_section
from components.toolstar.env import ToolStarEnv
from components.toolstar.evaluate import load_environment, score_episode
from components.toolstar.expert import ToolStarExpertPolicy
from components.toolstar.params import ToolStarParams
from components.toolstar.reward import Metric
from components.toolstar.tasks import Task, read_tasks

KIND = "toolstar"


class RewardParams(EnvironmentRewardParams):
    """`rl.reward` of a toolstar run: Tool-Star's reward (-1 for a format error, the answer's score, +0.1 for both tools; params/toolstar.yaml sets its metric)."""

    kind: Literal["toolstar"] = "toolstar"


REWARD_PARAMS = RewardParams  # rl.reward of a toolstar run
REWARD_COLUMNS = ["step", "reward", "reward_std", "task_reward", "success", "score", "bonus", "em", "f1",
                  "format_error_rate"]
EVAL_METRICS = ["accuracy", "mean_reward", "answer_rate", "em", "f1"]  # rl.eval's set metrics (eval.csv)
EVAL_CHECKS = ["format_ok", "answered", "correct", "multi_tool"]  # `check_rates`
# the params/toolstar.yaml keys an episode depends on (a change starts a fresh run instead of resuming)
EPISODE_KEYS = {"max_tool_calls", "reward_metric", "retriever", "sandbox"}


def task_reward(record: dict) -> TaskReward:
    """The reward of a finished Tool-Star rollout: its `evaluation` (from `score_episode`: -1 for a format error,
    else the answer's score plus the multi-tool bonus). Components: `success` (a correct answer), `score`, `bonus`,
    `em`, `f1`."""
    evaluation = record.get("evaluation") or {}
    if "reward" not in evaluation:
        raise ValueError(f"rollout {record.get('idx', '?')} has no Tool-Star evaluation (score_episode)")
    components = {"success": float(evaluation["correct"]), "score": float(evaluation["score"]),
                  "bonus": float(evaluation["bonus"]), "em": float(evaluation["em"]), "f1": float(evaluation["f1"])}
    return TaskReward(value=float(evaluation["reward"]), kind=KIND, components=components,
                      format_applied=not evaluation["format_ok"])


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def held_out_summary(records: Sequence[dict]) -> dict[str, float]:
    """The set metrics of evaluated episodes (`EVAL_METRICS`: accuracy is the share answered correctly) and the
    check rates (`EVAL_CHECKS`)."""
    evaluations = [r.get("evaluation") or {} for r in records]
    return {"accuracy": _mean([float(bool(e.get("correct"))) for e in evaluations]),
            "mean_reward": _mean([float(e.get("reward", 0.0)) for e in evaluations]),
            "answer_rate": _mean([float(r.get("termination") == "answer") for r in records]),
            "em": _mean([float(e.get("em", 0.0)) for e in evaluations]),
            "f1": _mean([float(e.get("f1", 0.0)) for e in evaluations]),
            **check_rates(records)}


def check_rates(records: Sequence[dict]) -> dict[str, float]:
    """Shares of rollouts that kept the format, answered, answered correctly, and used both tools."""
    n = max(len(records), 1)
    evaluations = [r.get("evaluation") or {} for r in records]
    return {"format_ok": sum(bool(e.get("format_ok")) for e in evaluations) / n,
            "answered": sum(r.get("termination") == "answer" for r in records) / n,
            "correct": sum(bool(e.get("correct")) for e in evaluations) / n,
            "multi_tool": sum(e.get("bonus", 0.0) > 0 for e in evaluations) / n}


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
    tasks_path: Path | None = None
    kind: str = KIND
    reward_columns: list[str] = field(default_factory=lambda: list(REWARD_COLUMNS))
    eval_metrics: list[str] = field(default_factory=lambda: list(EVAL_METRICS))
    eval_checks: list[str] = field(default_factory=lambda: list(EVAL_CHECKS))

    def __post_init__(self) -> None:
        self._index = {task.id: i for i, task in enumerate(self.items)}
        self._score = score_episode(self.metric)

    @property
    def shared(self) -> tuple:
        return (self.retriever, self.sandbox)

    def key(self, task: Task) -> str:
        return task.id

    def episode(self, task: Task, seed: int) -> Episode:
        """An episode of one of `items` (its `idx`: the task's place there)."""
        env = ToolStarEnv(task, self.retriever, self.sandbox, max_tool_calls=self.max_tool_calls)
        return Episode(idx=self._index[task.id], env=env, meta={"task": task, "level": task.kind})

    def evaluate(self, episode: Episode, record: dict) -> dict:
        return self._score(episode, record)

    def reward(self, record: dict, progress: float) -> TaskReward:
        return task_reward(record)

    def checks(self, records: Sequence[dict]) -> dict[str, float]:
        return check_rates(records)

    def summary(self, records: Sequence[dict]) -> dict[str, float]:
        return held_out_summary(records)

    def held_out(self, tasks: Path, max_items: int | None) -> "ToolStarSource":
        return replace(self, items=read_task_file(tasks, max_items), tasks_path=Path(tasks))

    def fingerprint(self, params: dict) -> tuple[dict, dict[str, Path | None]]:
        """The run's params with the toolstar settings its episodes depend on, the task file and the corpus."""
        return {**params, "toolstar": self.settings}, {"tasks": self.tasks_path, "corpus": self.corpus}


def read_task_file(path: Path, max_items: int | None = None) -> list[Task]:
    """The tasks of a task file (the first `max_items`)."""
    if not Path(path).exists():
        raise UserError(f"Tool-Star task file {path} does not exist (run the `toolstar_tasks` stage: dvc repro "
                        "toolstar_tasks; pass it as --queries)")
    tasks = read_tasks(path)[:max_items]
    if not tasks:
        raise UserError(f"Tool-Star task file {path} holds no tasks")
    return tasks


def load_source(inputs: SourceInputs) -> ToolStarSource:
    """The tasks of `inputs.tasks` (the first `max_items`), the search tool over the QA stage's corpus in
    `inputs.files["qa"]` (or params/toolstar.yaml's retriever, `inputs.files["params"]`) and its sandbox."""
    qa_dir, params_path = inputs.files.get("qa"), inputs.files.get("params")
    if qa_dir is None or params_path is None:
        raise UserError("rl.env.kind is toolstar: pass --qa (the search tool's corpus folder, data/qa) and "
                        "--toolstar-params (params/toolstar.yaml)")
    settings = load_section(params_path, "toolstar", ToolStarParams)
    tasks = read_task_file(inputs.tasks, inputs.max_items)
    corpus = None
    if settings.retriever.kind != "http":
        corpus = Path(settings.retriever.corpus or Path(qa_dir) / "corpus.jsonl")
        if not corpus.exists():
            raise UserError(f"the search tool's corpus {corpus} does not exist (run the QA stage: dvc repro "
                            "qa_data; or pass --qa)")
    retriever, sandbox = load_environment(settings, qa_dir)
    return ToolStarSource(tasks, retriever, sandbox, max_tool_calls=settings.max_tool_calls,
                          metric=settings.reward_metric,
                          settings=settings.model_dump(mode="json", include=EPISODE_KEYS), corpus=corpus,
                          tasks_path=Path(inputs.tasks))


def expert_policy(seed: int = 0) -> ToolStarExpertPolicy:
    """The programmatic expert that solves generated Tool-Star tasks (`seed` unused: it is deterministic)."""
    return ToolStarExpertPolicy()
