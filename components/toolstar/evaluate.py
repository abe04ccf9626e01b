"""Tool-Star episodes through the shared agent loop, their scores, and the metrics of a set of them.

    records = run_toolstar(tasks, retriever, sandbox, policy, params, limits, tokenizer=None)
    metrics = summarize(records)              # accuracy, reward, EM/F1, tool calls, code errors, ... by task kind

One episode per task (`ToolStarEnv` over the QA stage's retriever and the bubblewrap sandbox); when it ends,
`score_episode` gives the record its `evaluation`: Tool-Star's reward (`components/toolstar/reward.py`,
`trajectory_reward`) and its parts, whether the boxed answer is correct by the reward's metric (`correct`: the
answer scores 1, the format aside, so a model that answers after a refused call still counts; the metric follows
the task's kind, `reward.task_metric`: math_verify for a dataset's math task, token F1 for its QA task), EM and
token F1 against every golden answer (SQuAD normalisation, the OOD QA stage's), and the environment's counts
(`stats`: tool calls by tool, code errors, sandbox kills, format errors, refused calls). The expert's SFT data (the
toolstar_sft_data stage's `teach`, components/evaluation/toolstar.py), the checkpoint evaluation and RL share all
of it.
"""
from __future__ import annotations

import copy
import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from components.agent.loop import Episode, Evaluate, Limits, run_episodes
from components.answer_match import exact_match, f1_score
from components.retrieval import make_retriever
from components.stats import rate_interval
from components.toolstar.env import ToolStarEnv
from components.toolstar.params import ToolStarParams
from components.toolstar.reward import Metric, answer_score, task_metric, trajectory_reward
from components.toolstar.sandbox import Sandbox
from components.toolstar.tasks import Task, read_tasks

TOOLS = ("search", "python")
COUNTS = ("code_errors", "sandbox_kills", "format_errors", "refused_calls")


def toolstar_episodes(tasks: Sequence[Task], retriever, sandbox, max_tool_calls: int) -> list[Episode]:
    """One `ToolStarEnv` episode per task; `meta` carries the task (the scorer reads it) and its kind as the level."""
    return [Episode(idx=i, env=ToolStarEnv(task, retriever, sandbox, max_tool_calls=max_tool_calls),
                    meta={"task": task, "level": task.kind}, episode_id=task.id)
            for i, task in enumerate(tasks)]


def score_episode(metric: Metric = "auto") -> Evaluate:
    """The loop's `evaluate` callback: the reward breakdown, `correct`, `em`, `f1` and the environment's `stats`.
    `metric` is the params' `reward_metric`; each task is scored by `task_metric(task.kind, metric)`."""
    def evaluate(episode: Episode, record: dict) -> dict:
        task = episode.meta["task"]
        golden, scored_by = task.golden, task_metric(task.kind, metric)
        answer = record.get("answer")
        return {**trajectory_reward(record, golden, scored_by).to_dict(),
                "correct": answer_score(answer, golden, scored_by) >= 1.0,
                "em": exact_match(answer, golden), "f1": f1_score(answer, golden),
                "stats": copy.deepcopy(episode.env.stats)}

    return evaluate


def run_toolstar(tasks: Sequence[Task], retriever, sandbox, policy, params: ToolStarParams, limits: Limits,
                 tokenizer=None, progress: bool = True) -> list[dict]:
    """Every task through `run_episodes` with `policy`; each record gets the task's `id`, `kind`, `template`,
    `question`, `golden_answer` (and, for a dataset's task, `golden_answers` and `dataset`) and the `evaluation` of
    `score_episode`."""
    records = run_episodes(toolstar_episodes(tasks, retriever, sandbox, params.max_tool_calls), policy,
                           limits=limits, tokenizer=tokenizer, evaluate=score_episode(params.reward_metric),
                           progress=progress)
    for task, record in zip(tasks, records):
        record.update({"id": task.id, "kind": task.kind, "template": task.template, "question": task.question,
                       "golden_answer": task.answer})
        if task.dataset:
            record.update({"dataset": task.dataset, "golden_answers": task.golden})
    return records


# --- metrics ----------------------------------------------------------------------------------------------------

def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def summarize_group(records: list[dict]) -> dict:
    """The metrics of a set of scored records: `n`, `accuracy` (correct answers) and `accuracy_ci95` (its 95% Wilson
    interval), `mean_reward`,
    `reward_positive_rate`, `format_ok_rate`, `answer_rate`, `em`, `f1`, `tool_calls` (per episode, by tool and in
    all), `code_errors`, `sandbox_kills`, `format_errors`, `refused_calls` (totals), `termination` (counts)."""
    evaluations = [r["evaluation"] for r in records]
    stats = [e["stats"] for e in evaluations]
    accuracy = _mean([float(e["correct"]) for e in evaluations])
    calls = {tool: _mean([s["tool_calls"][tool] for s in stats]) for tool in TOOLS}
    return {
        "n": len(records),
        "accuracy": accuracy,
        "accuracy_ci95": rate_interval(accuracy, len(records)),
        "mean_reward": _mean([e["reward"] for e in evaluations]),
        "reward_positive_rate": _mean([float(e["reward"] > 0) for e in evaluations]),
        "format_ok_rate": _mean([float(e["format_ok"]) for e in evaluations]),
        "answer_rate": _mean([float(r["termination"] == "answer") for r in records]),
        "em": _mean([e["em"] for e in evaluations]),
        "f1": _mean([e["f1"] for e in evaluations]),
        "tool_calls": {**calls, "total": sum(calls.values())},
        **{count: sum(s[count] for s in stats) for count in COUNTS},
        "termination": dict(Counter(r["termination"] for r in records)),
    }


def summarize(records: list[dict]) -> dict:
    """`summarize_group` over every record, plus `by_kind` (multi_hop_arithmetic, compute, math, qa): the same per
    kind, and, when records come from evaluation datasets, `by_dataset` (gsm8k, hotpotqa, ...): the same per
    dataset (a record without one, a generated task's, is in no dataset group)."""
    kinds = sorted({r["kind"] for r in records})
    metrics = {**summarize_group(records),
               "by_kind": {kind: summarize_group([r for r in records if r["kind"] == kind]) for kind in kinds}}
    datasets = sorted({r["dataset"] for r in records if r.get("dataset")})
    if datasets:
        metrics["by_dataset"] = {name: summarize_group([r for r in records if r.get("dataset") == name])
                                 for name in datasets}
    return metrics


# --- a checkpoint -----------------------------------------------------------------------------------------------

def load_environment(params: ToolStarParams, qa_dir: str | Path):
    """(retriever, sandbox): the search tool over the QA stage's corpus (or the configured one) and the sandbox
    (an error saying how to get bubblewrap, or to opt into `isolation: rlimit`, when it cannot isolate here)."""
    return make_retriever(params.retriever, qa_dir), Sandbox(params.sandbox)


def load_task_set(params: ToolStarParams, qa_dir: str | Path, tasks_path: str | Path,
                  max_tasks: int | None = None) -> tuple[list[Task], object, Sandbox]:
    """(tasks, retriever, sandbox): the first `max_tasks` tasks of `tasks_path` (all with None) and the environment
    they run in (`load_environment`)."""
    return (read_tasks(tasks_path)[:max_tasks], *load_environment(params, qa_dir))
