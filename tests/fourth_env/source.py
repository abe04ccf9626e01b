"""The lookup game's task source: what the registry hands the stages for `env.kind: lookup`."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from components.agent.environment import RewardParams as EnvironmentRewardParams
from components.agent.environment import SourceInputs, TaskReward
from components.agent.loop import Episode
from fourth_env.env import LookupEnv
from fourth_env.evaluate import accuracy, evaluate, summary
from fourth_env.expert import LookupExpert
from fourth_env.reward import task_reward
from fourth_env.tasks import read_tasks

KIND = "lookup"


class RewardParams(EnvironmentRewardParams):
    """`rl.reward` of a lookup run: 1 for the right value."""

    kind: Literal["lookup"] = "lookup"


REWARD_PARAMS = RewardParams  # rl.reward of a lookup run
REWARD_COLUMNS = ["step", "reward", "reward_std", "task_reward", "success", "format_error_rate"]


@dataclass
class LookupSource:
    items: list[dict]
    tasks_path: Path
    kind: str = KIND
    reward_columns: list[str] = field(default_factory=lambda: list(REWARD_COLUMNS))
    eval_metrics: list[str] = field(default_factory=lambda: ["answered_rate"])
    eval_checks: list[str] = field(default_factory=lambda: ["correct"])

    @property
    def shared(self) -> tuple:
        return ()

    def key(self, task: dict) -> str:
        return task["id"]

    def episode(self, task: dict, seed: int) -> Episode:
        codes = {t["name"]: t["code"] for t in self.items}
        return Episode(idx=self.items.index(task), env=LookupEnv(task, codes), meta={"task": task})

    def evaluate(self, episode: Episode, record: dict) -> dict:
        return evaluate(episode, record)

    def reward(self, record: dict, progress: float) -> TaskReward:
        return task_reward(record)

    def checks(self, records: list[dict]) -> dict[str, float]:
        return accuracy(records)

    def summary(self, records: list[dict]) -> dict[str, float]:
        return summary(records)

    def held_out(self, tasks: Path, max_items: int | None) -> "LookupSource":
        return replace(self, items=read_tasks(tasks)[:max_items], tasks_path=Path(tasks))

    def fingerprint(self, params: dict) -> tuple[dict, dict[str, Path | None]]:
        return params, {"tasks": self.tasks_path}


def load_source(inputs: SourceInputs) -> LookupSource:
    return LookupSource(read_tasks(inputs.tasks)[:inputs.max_items], Path(inputs.tasks))


def expert_policy(seed: int = 0) -> LookupExpert:
    return LookupExpert()
