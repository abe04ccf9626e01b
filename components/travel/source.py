"""The travel environment's task source (`env.kind: travel`): TravelPlanner queries over one world, the strict
evaluation of each rollout's plan (both evaluator modes with `full_evaluation`: the trajectories stage's records)
and the STAR reward kinds (`reward.py`: SUM, MACRO, SUCCESS, CURRICULUM, or the format reward for a trajectory with
no parseable plan or a protocol failure).

    source = load_source(SourceInputs(tasks=Path("data/queries/rl.jsonl"), files={"world": Path("data/world")}))
    episode = source.episode(source.items[0], seed=0)
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from components.agent.environment import SourceInputs, TaskReward
from components.agent.loop import Episode
from components.errors import UserError
from components.travel.env import TravelEnv
from components.travel.evaluate import PlanEvaluation, evaluate_plan, travel_evaluate
from components.travel.evaluate import COMMONSENSE_CHECKS, HARD_CHECKS
from components.travel.expert import ExpertConfig, ExpertPolicy
from components.travel.metrics import summarize
from components.travel.reward import COMPONENTS, RewardParams, reward
from components.travel.tasks import level_stratified_prefix, load_queries
from components.travel.world import World

KIND = "travel"
REWARD_PARAMS = RewardParams  # rl.reward of a travel run
REWARD_COLUMNS = ["step", "reward", "reward_std", "task_reward", "cs_micro", "hard_micro", "cs_macro", "hard_macro",
                  "success", "format_error_rate"]
PROTOCOL_FAILURES = ("protocol_errors",)
# rl.eval's set metrics and checks (eval.csv): the validate stage's strict summary
EVAL_METRICS = ["delivery_rate", "commonsense_micro", "commonsense_macro", "hard_micro", "hard_macro", "final_pass"]
EVAL_CHECKS = [*COMMONSENSE_CHECKS, *HARD_CHECKS]


def strict_evaluation(world, query, record: dict) -> dict:
    """The `evaluation` field of a rollout record: the strict evaluation of its plan (None plans included)."""
    return {"strict": evaluate_plan(world, query, record.get("plan"), mode="strict").to_dict()}


def task_reward(record: dict, settings: RewardParams, progress: float) -> TaskReward:
    """The STAR reward of one finished rollout at training progress `progress` in [0, 1] with the `rl.reward`
    `settings` (kind, weights, curriculum boundaries, format reward)."""
    strict = (record.get("evaluation") or {}).get("strict")
    evaluation = PlanEvaluation.from_dict(strict) if strict else None
    breakdown = reward(
        evaluation, settings.kind, progress=progress, weights=settings.reward_weights(),
        curriculum_boundaries=settings.curriculum_boundaries, format_reward=settings.format_reward,
        protocol_failure=record.get("termination") in PROTOCOL_FAILURES,
    )
    return TaskReward(value=breakdown.reward, kind=breakdown.kind,
                      components={name: float(getattr(breakdown, name)) for name in COMPONENTS},
                      format_applied=breakdown.format_applied)


def strict_summary(queries: Sequence, records: Sequence[dict]) -> dict[str, float | None]:
    """The strict set metrics (`EVAL_METRICS`) and per-check pass rates (`EVAL_CHECKS`) of evaluated rollouts of
    `queries`, as the validate stage's strict summary counts them (an undelivered plan passes nothing)."""
    by_idx = {query.idx: query for query in queries}
    evaluations = [PlanEvaluation.from_dict(strict) if (strict := (r.get("evaluation") or {}).get("strict")) else None
                   for r in records]
    metrics = summarize([by_idx[r["idx"]] for r in records], evaluations)
    return {**{key: metrics[key] for key in EVAL_METRICS}, **metrics["per_check"]}


def check_pass_rates(records: Sequence[dict]) -> dict[str, float]:
    """Per check, the share of rollouts where it passed (n/a hard checks are left out of their denominator)."""
    passed: dict[str, int] = {}
    seen: dict[str, int] = {}
    for record in records:
        strict = (record.get("evaluation") or {}).get("strict") or {}
        for block in ("commonsense", "hard"):
            for name, result in (strict.get(block) or {}).items():
                if result["status"] == "n/a":
                    continue
                seen[name] = seen.get(name, 0) + 1
                passed[name] = passed.get(name, 0) + int(result["status"] == "pass")
    return {name: passed[name] / seen[name] for name in sorted(seen)}


@dataclass
class TravelSource:
    """TravelPlanner queries over one world: the strict evaluation and the STAR reward."""

    world: Any
    items: list = field(default_factory=list)  # the queries (`Query`)
    failure_rate: float = 0.0  # injected transient tool failures
    reward_settings: RewardParams = field(default_factory=RewardParams)  # rl.reward
    world_dir: Path | None = None
    tasks_path: Path | None = None
    full_evaluation: bool = False  # evaluate in both modes (strict and official), not only the reward's strict
    kind: str = KIND
    reward_columns: list[str] = field(default_factory=lambda: list(REWARD_COLUMNS))
    eval_metrics: list[str] = field(default_factory=lambda: list(EVAL_METRICS))
    eval_checks: list[str] = field(default_factory=lambda: list(EVAL_CHECKS))

    @property
    def shared(self) -> tuple:
        return (self.world,)

    def key(self, query) -> int:
        return query.idx

    def episode(self, query, seed: int) -> Episode:
        env = TravelEnv(self.world, query, failure_rate=self.failure_rate, seed=seed)
        return Episode(idx=query.idx, env=env, meta={"level": query.level, "query": query})

    def evaluate(self, episode: Episode, record: dict) -> dict:
        if self.full_evaluation:
            return travel_evaluate(self.world)(episode, record)
        return strict_evaluation(self.world, episode.meta["query"], record)

    def reward(self, record: dict, progress: float) -> TaskReward:
        return task_reward(record, self.reward_settings, progress)

    def checks(self, records: Sequence[dict]) -> dict[str, float]:
        return check_pass_rates(records)

    def summary(self, records: Sequence[dict]) -> dict[str, float | None]:
        return strict_summary(self.items, records)

    def held_out(self, tasks: Path, max_items: int | None) -> "TravelSource":
        return replace(self, items=read_queries(tasks, max_items), tasks_path=Path(tasks), failure_rate=0.0,
                       full_evaluation=False)

    def fingerprint(self, params: dict) -> tuple[dict, dict[str, Path | None]]:
        """The run's params without `env.kind` (a travel run hashes as before env.kind existed), the world and the
        queries."""
        params = {**params, "env": {k: v for k, v in params.get("env", {}).items() if k != "kind"}}
        return params, {"world": self.world_dir, "queries": self.tasks_path}


def read_queries(path: Path, max_items: int | None = None) -> list:
    """The queries of a query file (the first `max_items` at the file's level mix)."""
    if not Path(path).exists():
        raise UserError(f"query file {path} does not exist (run the `queries` stage: dvc repro queries)")
    queries = load_queries(path)
    if not queries:
        raise UserError(f"query file {path} holds no queries")
    return level_stratified_prefix(queries, max_items) if max_items is not None else queries


def load_source(inputs: SourceInputs) -> TravelSource:
    """The queries of `inputs.tasks` (the first `max_items` at the file's level mix) over the world of
    `inputs.files["world"]`."""
    world_dir = inputs.files.get("world")
    queries = read_queries(inputs.tasks, inputs.max_items)
    if world_dir is None or not Path(world_dir).exists():
        raise UserError(f"world directory {world_dir} does not exist (run the `world` stage: dvc repro world)")
    return TravelSource(World.load(world_dir), queries, failure_rate=inputs.failure_rate,
                        reward_settings=inputs.reward or RewardParams(), world_dir=Path(world_dir), tasks_path=Path(inputs.tasks),
                        full_evaluation=inputs.full_evaluation)


def expert_policy(seed: int = 0, **options) -> ExpertPolicy:
    """The programmatic expert that solves travel queries (the teacher of the tiny preset); `options` are
    `ExpertConfig`'s other fields (mistake_rate, max_routes, shortlist, max_tool_calls, slip_rate)."""
    return ExpertPolicy(ExpertConfig(seed=seed, **options))


def digest(value: Any) -> str:
    """sha256 of a JSON-able value (keys sorted)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def input_digests(source: TravelSource, queries: Sequence) -> dict[str, Any]:
    """sha256 of the world (its manifest: table hashes and generator params, not its creation time) and of each of
    `queries` by idx: what a resumed trajectories stage must find unchanged."""
    manifest = {k: v for k, v in dict(getattr(source.world, "manifest", None) or {}).items() if k != "created"}
    return {"world": digest(manifest), "queries": {str(q.idx): digest(q.to_dict()) for q in queries}}
