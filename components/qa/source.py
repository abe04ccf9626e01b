"""The QA environment's task source (`env.kind: qa`): one question per episode answered with the search tool over
the QA stage's corpus, rewarded by the exact match of its answer (token F1 alongside).

    source = load_source(SourceInputs(tasks=Path("data/qa/questions/multi_hop.jsonl"), files={"qa": Path("data/qa")}))
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
from components.qa.env import QAEnv
from components.qa.expert import QAExpertPolicy
from components.qa.reward import score_record
from components.qa.tasks import load_jsonl_dataset
from components.retrieval import BM25Retriever, load_corpus

KIND = "qa"


class RewardParams(EnvironmentRewardParams):
    """`rl.reward` of a qa run: the answer's exact match."""

    kind: Literal["qa"] = "qa"


REWARD_PARAMS = RewardParams  # rl.reward of a qa run
REWARD_COLUMNS = ["step", "reward", "reward_std", "task_reward", "success", "em", "f1", "format_error_rate"]
EVAL_METRICS = ["em", "f1"]  # rl.eval's set metrics (eval.csv)
EVAL_CHECKS = ["answered", "exact"]  # `check_rates`


def task_reward(record: dict) -> TaskReward:
    """EM of the episode's answer as the reward (and its success); no answer is the format failure."""
    evaluation = record.get("evaluation") or score_record(record, [])
    return TaskReward(value=float(evaluation["em"]), kind=KIND,
                      components={"success": float(evaluation["em"]), "em": float(evaluation["em"]),
                                  "f1": float(evaluation["f1"])},
                      format_applied=record.get("answer") is None)


def check_rates(records: Sequence[dict]) -> dict[str, float]:
    """Shares of episodes that gave an answer and that answered exactly."""
    n = max(len(records), 1)
    return {"answered": sum(r.get("answer") is not None for r in records) / n,
            "exact": sum((r.get("evaluation") or {}).get("em", 0.0) for r in records) / n}


def held_out_summary(records: Sequence[dict]) -> dict[str, float]:
    """Mean EM and F1 of evaluated episodes (`EVAL_METRICS`) and the check rates (`EVAL_CHECKS`)."""
    n = max(len(records), 1)
    evaluations = [r.get("evaluation") or {} for r in records]
    return {"em": sum(float(e.get("em", 0.0)) for e in evaluations) / n,
            "f1": sum(float(e.get("f1", 0.0)) for e in evaluations) / n, **check_rates(records)}


@dataclass
class QASource:
    """Questions (records with `question` and `golden_answers`) answered with `retriever`."""

    items: list[dict]
    retriever: Any
    tasks_path: Path | None = None
    corpus: Path | None = None
    kind: str = KIND
    reward_columns: list[str] = field(default_factory=lambda: list(REWARD_COLUMNS))
    eval_metrics: list[str] = field(default_factory=lambda: list(EVAL_METRICS))
    eval_checks: list[str] = field(default_factory=lambda: list(EVAL_CHECKS))

    def __post_init__(self) -> None:
        self._index = {str(item["id"]): i for i, item in enumerate(self.items)}

    @property
    def shared(self) -> tuple:
        return (self.retriever,)

    def key(self, question: dict) -> str:
        return str(question["id"])

    def episode(self, question: dict, seed: int) -> Episode:
        return Episode(idx=self._index[str(question["id"])], env=QAEnv(question["question"], self.retriever),
                       meta={**question, "level": question.get("dataset")})

    def evaluate(self, episode: Episode, record: dict) -> dict:
        return score_record(record, episode.meta["golden_answers"])

    def reward(self, record: dict, progress: float) -> TaskReward:
        return task_reward(record)

    def checks(self, records: Sequence[dict]) -> dict[str, float]:
        return check_rates(records)

    def summary(self, records: Sequence[dict]) -> dict[str, float]:
        return held_out_summary(records)

    def held_out(self, tasks: Path, max_items: int | None) -> "QASource":
        return replace(self, items=load_jsonl_dataset(tasks, limit=max_items), tasks_path=Path(tasks))

    def fingerprint(self, params: dict) -> tuple[dict, dict[str, Path | None]]:
        return params, {"tasks": self.tasks_path, "corpus": self.corpus}


def load_source(inputs: SourceInputs) -> QASource:
    """The questions of `inputs.tasks` (the first `max_items`) and BM25 over `inputs.files["qa"]`'s corpus.jsonl."""
    qa_dir = inputs.files.get("qa")
    corpus = Path(qa_dir or "") / "corpus.jsonl"
    if qa_dir is None or not corpus.exists():
        raise UserError(f"the search tool's corpus {corpus} does not exist (run the QA stage: dvc repro qa_data; "
                        "or pass --qa)")
    questions = load_jsonl_dataset(inputs.tasks, limit=inputs.max_items)
    return QASource(questions, BM25Retriever(load_corpus(corpus)), tasks_path=Path(inputs.tasks), corpus=corpus)


def expert_policy(seed: int = 0) -> QAExpertPolicy:
    """The programmatic expert that answers generated questions (`seed` unused: it is deterministic)."""
    return QAExpertPolicy()
