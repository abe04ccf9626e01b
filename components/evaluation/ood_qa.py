"""The ood-qa stage: a checkpoint on out-of-domain QA, its EM/F1 with intervals, and the alignment tax.

The QA environment's OOD set (its params `OODQAParams`, the offline QA data `build_qa_data`, the datasets and a
policy's per-question results: components/qa/ood.py) is reached through the environment registry. `evaluate_checkpoint`
runs a checkpoint on every configured dataset, in mode `search` (the model calls the search tool) or `in_context` (the
question's retrieved passages are in the conversation and the model answers in one turn), and summarises the
per-question EM/F1, with the alignment tax against the base's per-question results when given
(components/evaluation/question_results.py).

Intervals (95%): the EM of one dataset is a rate, with its Wilson interval; every other number (F1, the averages over
datasets, the tax) is a mean of per-question values, with a percentile bootstrap over questions (resampled within
each dataset, `BOOTSTRAP_RESAMPLES` draws, seed `BOOTSTRAP_SEED`, so a file's intervals are reproducible).
"""
from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path
from types import ModuleType

from components import environments
from components.evaluation.policy import load_checkpoint_policy
from components.evaluation.question_results import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, alignment_tax, with_tax
from components.retrieval import make_retriever
from components.stats import bootstrap_interval, rate_interval

KIND = "qa"  # the environment the ood-qa stage evaluates on


def ood() -> ModuleType:
    """The QA environment's OOD set module (components/qa/ood.py)."""
    return environments.package_module(KIND, "ood")


# --- summaries --------------------------------------------------------------------------------------------------

def _interval(values: dict[str, list[float]]) -> list[float]:
    low, high = bootstrap_interval(values, BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED)
    return [round(low, 4), round(high, 4)]


def summarize_questions(results: list[dict]) -> dict:
    """EM and F1 with their 95% intervals, answer rate, tool calls and terminations of one dataset's per-question
    results (and the share whose answer was in the context, in mode `in_context`)."""
    n = len(results)
    if n == 0:
        return {"n": 0, "em": 0.0, "f1": 0.0, "answer_rate": 0.0, "mean_tool_calls": 0.0, "termination": {}}
    em = sum(r["em"] for r in results) / n
    summary = {
        "n": n,
        "em": em,
        "em_ci95": rate_interval(em, n),
        "f1": sum(r["f1"] for r in results) / n,
        "f1_ci95": _interval({"": [r["f1"] for r in results]}),
        "answer_rate": sum(r["termination"] == "answer" for r in results) / n,
        "mean_tool_calls": sum(r["num_tool_calls"] for r in results) / n,
        "termination": dict(Counter(r["termination"] for r in results)),
    }
    if all("answer_in_context" in r for r in results):
        summary["answer_in_context"] = sum(r["answer_in_context"] for r in results) / n
    return summary


def by_dataset(results: list[dict]) -> dict[str, list[dict]]:
    """Per-question results grouped by dataset, in order of first appearance."""
    groups: dict[str, list[dict]] = {}
    for result in results:
        groups.setdefault(result["dataset"], []).append(result)
    return groups


def summarize_datasets(per_dataset: dict[str, dict], results: list[dict] | None = None) -> dict:
    """Averages over datasets (each dataset weighs the same, as in the paper's "Avg." column); with the per-question
    `results` behind them, also their 95% bootstrap intervals (`em_ci95`, `f1_ci95`)."""
    scored = [s for s in per_dataset.values() if s["n"]]
    summary = {
        "em": statistics.fmean(s["em"] for s in scored) if scored else 0.0,
        "f1": statistics.fmean(s["f1"] for s in scored) if scored else 0.0,
        "n": sum(s["n"] for s in scored),
    }
    if results:
        groups = by_dataset(results)
        summary["em_ci95"] = _interval({d: [r["em"] for r in group] for d, group in groups.items()})
        summary["f1_ci95"] = _interval({d: [r["f1"] for r in group] for d, group in groups.items()})
    return {**summary, "per_dataset": per_dataset}


def summarize(results: list[dict]) -> dict:
    """The OOD metrics of per-question results: per dataset, and averaged over datasets."""
    return summarize_datasets({d: summarize_questions(group) for d, group in by_dataset(results).items()}, results)


def evaluate_checkpoint(model: str | Path, params, qa_dir: str | Path,
                        base_questions: list[dict] | None = None,
                        records_out: list | None = None) -> tuple[dict, list[dict]]:
    """(metrics, per-question results) of a checkpoint with `params` (`OODQAParams`). The metrics (the contract of
    `metrics/ood_qa/<checkpoint>.json`): `mode`, `em`, `f1` (averages over datasets) with their intervals,
    `per_dataset`, and the alignment tax paired with `base_questions` (the base's per-question results) when given."""
    qa = ood()
    policy, tokenizer = load_checkpoint_policy(model, params.decoding, params.limits.max_context_tokens)
    results = qa.evaluate_policy(policy, qa.load_datasets(params, qa_dir), make_retriever(params.retriever, qa_dir),
                                 params.limits.to_limits(), tokenizer=tokenizer, records_out=records_out,
                                 mode=params.mode, examples=params.in_context_examples)
    metrics = {"mode": params.mode, **summarize(results)}
    if base_questions is not None:
        metrics = with_tax(metrics, alignment_tax(base_questions, results))
    return metrics, results
