"""Out-of-domain QA: build the offline QA data, evaluate a checkpoint on QA, and the alignment tax.

`build_qa_data` writes the encyclopedia corpus and its question sets (and checks them with the QA expert);
`evaluate_checkpoint` runs a checkpoint through the shared agent loop on every configured dataset, in mode `search`
(the model calls the search tool) or `in_context` (the question's retrieved passages are in the conversation and
the model answers in one turn), and scores EM/F1 per question; `alignment_tax` pairs a trained checkpoint's
per-question scores with the base model's, question by question.

Intervals (95%): the EM of one dataset is a rate, with its Wilson interval; every other number (F1, the averages over
datasets, the tax) is a mean of per-question values, with a percentile bootstrap over questions (resampled within
each dataset, `BOOTSTRAP_RESAMPLES` draws, seed `BOOTSTRAP_SEED`, so a file's intervals are reproducible).
"""
from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path
from typing import Literal

from pydantic import Field

from components.agent.loop import Limits
from components.evaluation.policy import DecodingParams, LimitsParams, load_checkpoint_policy
from components.errors import UserError
from components.params import Params
from components.qa import corpus as qa_corpus
from components.qa.env import IN_CONTEXT_EXAMPLES
from components.qa.evaluate import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, QAMode, alignment_tax, run_qa, with_tax
from components.qa.expert import QAExpertPolicy
from components.qa.tasks import dump_jsonl, load_hf_dataset, load_jsonl_dataset
from components.retrieval import BM25Retriever, RetrieverParams, make_retriever
from components.stats import bootstrap_interval, rate_interval


class CorpusParams(Params):
    """Size and seed of a generated encyclopedia."""

    seed: int = 0
    num_people: int = Field(300, ge=2)
    num_towns: int = Field(60, ge=2)
    num_organisations: int = Field(40, ge=1)


class DatasetParams(Params):
    """One QA dataset: `generated` (data/qa/questions/<name>.jsonl), a local `jsonl` file, or `hf` (FlashRAG)."""

    name: str
    source: Literal["generated", "jsonl", "hf"] = "generated"
    path: str | None = None
    split: str = "test"
    limit: int | None = Field(None, ge=1)


class OODQAParams(Params):
    """params/ood_qa.yaml, section `ood_qa`."""

    mode: QAMode = "search"  # search: the model calls the search tool; in_context: the passages are in the prompt
    in_context_examples: int = Field(len(IN_CONTEXT_EXAMPLES), ge=0, le=len(IN_CONTEXT_EXAMPLES))
    corpus: CorpusParams = CorpusParams()
    questions_per_dataset: int = Field(100, ge=1)
    datasets: list[DatasetParams] = [DatasetParams(name="single_hop"), DatasetParams(name="multi_hop")]
    retriever: RetrieverParams = RetrieverParams()
    limits: LimitsParams = LimitsParams(max_turns=4, max_tokens_per_turn=128, max_context_tokens=2048,
                                        max_protocol_errors=2)
    decoding: DecodingParams = DecodingParams(batch_size=32)
    max_questions: int | None = Field(None, ge=1)  # cap per dataset (quick runs)


# --- building the offline QA data -------------------------------------------------------------------------------

def _encyclopedia(params: CorpusParams, questions_per_dataset: int) -> qa_corpus.Encyclopedia:
    return qa_corpus.build_encyclopedia(params.num_people, params.num_towns, params.num_organisations,
                                        questions_per_dataset, params.seed)


def retrieval_recall(questions: list[dict], retriever) -> float:
    """Share of questions whose first gold passage is among the retriever's top-k for the question text."""
    if not questions:
        return 0.0
    results = retriever.batch_search([q["question"] for q in questions])
    hits = [q["gold_passages"][0] in {p["id"] for p in passages} for q, passages in zip(questions, results)]
    return sum(hits) / len(hits)


def build_qa_data(params: OODQAParams, out_dir: str | Path) -> dict:
    """Write `corpus.jsonl` and `questions/{single_hop,multi_hop}.jsonl` under `out_dir`; return the summary metrics
    (counts, retriever recall, the expert's EM: the questions are answerable with the search tool)."""
    out = Path(out_dir)
    evaluation = _encyclopedia(params.corpus, params.questions_per_dataset)
    passages = [p.to_dict() for p in evaluation.passages]
    dump_jsonl(passages, out / "corpus.jsonl")
    for dataset, questions in evaluation.questions.items():
        dump_jsonl(questions, out / "questions" / f"{dataset}.jsonl")
    retriever = BM25Retriever(passages, top_k=params.retriever.top_k)
    metrics = {
        "passages": len(passages),
        "mean_passage_words": statistics.fmean(len(p["text"].split()) for p in passages),
        "questions": {d: len(q) for d, q in evaluation.questions.items()},
        f"retrieval_recall_at_{params.retriever.top_k}": {
            d: retrieval_recall(q, retriever) for d, q in evaluation.questions.items()},
    }
    expert_scores = summarize(evaluate_policy(QAExpertPolicy(), evaluation.questions, retriever,
                                              params.limits.to_limits()))
    metrics["expert_em"] = {d: s["em"] for d, s in expert_scores["per_dataset"].items()}
    return metrics


# --- evaluating a policy ----------------------------------------------------------------------------------------

def load_datasets(params: OODQAParams, qa_dir: str | Path) -> dict[str, list[dict]]:
    """The configured datasets, each capped at `max_questions` (or its own `limit`)."""
    datasets = {}
    for spec in params.datasets:
        caps = [cap for cap in (spec.limit, params.max_questions) if cap is not None]
        limit = min(caps) if caps else None
        if spec.source == "generated":
            examples = load_jsonl_dataset(Path(qa_dir) / "questions" / f"{spec.name}.jsonl", spec.name, limit)
        elif spec.source == "jsonl":
            if not spec.path:
                raise UserError(f"ood_qa.datasets: dataset {spec.name!r} has source jsonl but no path")
            examples = load_jsonl_dataset(spec.path, spec.name, limit)
        else:
            examples = load_hf_dataset(spec.name, spec.split, limit=limit)
        datasets[spec.name] = examples
    return datasets


def question_result(record: dict) -> dict:
    """One line of the per-question results (`questions_path`): a trajectory record reduced to what pairing by
    question id, the summaries and the alignment tax read."""
    result = {"id": str(record["id"]), "dataset": record["dataset"], "mode": record["mode"],
              "em": record["evaluation"]["em"], "f1": record["evaluation"]["f1"], "answer": record["answer"],
              "termination": record["termination"], "num_tool_calls": record["num_tool_calls"]}
    if "answer_in_context" in record:
        result["answer_in_context"] = record["answer_in_context"]
    return result


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


def evaluate_policy(policy, datasets: dict[str, list[dict]], retriever, limits: Limits, tokenizer=None,
                    records_out: list | None = None, mode: QAMode = "search",
                    examples: int = len(IN_CONTEXT_EXAMPLES)) -> list[dict]:
    """Run `policy` on every dataset in `mode` and return the per-question results; trajectories are appended to
    `records_out` when given."""
    results = []
    for questions in datasets.values():
        records = run_qa(questions, retriever, policy, limits, tokenizer=tokenizer, progress=True, mode=mode,
                         examples=examples)
        results += [question_result(record) for record in records]
        if records_out is not None:
            records_out.extend(records)
    return results


def evaluate_checkpoint(model: str | Path, params: OODQAParams, qa_dir: str | Path,
                        base_questions: list[dict] | None = None,
                        records_out: list | None = None) -> tuple[dict, list[dict]]:
    """(metrics, per-question results) of a checkpoint. The metrics (the contract of
    `metrics/ood_qa/<checkpoint>.json`): `mode`, `em`, `f1` (averages over datasets) with their intervals,
    `per_dataset`, and the alignment tax paired with `base_questions` (the base's per-question results) when given."""
    policy, tokenizer = load_checkpoint_policy(model, params.decoding, params.limits.max_context_tokens)
    results = evaluate_policy(policy, load_datasets(params, qa_dir), make_retriever(params.retriever, qa_dir),
                              params.limits.to_limits(), tokenizer=tokenizer, records_out=records_out,
                              mode=params.mode, examples=params.in_context_examples)
    metrics = {"mode": params.mode, **summarize(results)}
    if base_questions is not None:
        metrics = with_tax(metrics, alignment_tax(base_questions, results))
    return metrics, results
