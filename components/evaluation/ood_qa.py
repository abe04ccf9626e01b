"""Out-of-domain QA: build the offline QA data, evaluate a checkpoint on QA with search, and the alignment tax.

`build_qa_data` writes the encyclopedia corpus and its question sets (and checks them with the QA expert);
`evaluate_checkpoint` runs a checkpoint through the shared agent loop on every configured dataset and scores EM/F1;
`alignment_tax` compares a trained checkpoint's scores with the base model's.
"""
from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Literal

from pydantic import Field

from components.agent.loop import Limits
from components.evaluation.policy import DecodingParams, LimitsParams, load_checkpoint_policy
from components.errors import UserError
from components.qa import corpus as qa_corpus
from components.qa.tasks import dump_jsonl, load_hf_dataset, load_jsonl_dataset
from components.qa.expert import QAExpertPolicy
from components.qa.evaluate import alignment_tax, run_qa
from components.params import Params
from components.retrieval import BM25Retriever, RetrieverParams, load_corpus, make_retriever


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
    expert_scores = evaluate_policy(QAExpertPolicy(), evaluation.questions, retriever, params.limits.to_limits())
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


def summarize_records(records: list[dict]) -> dict:
    """EM, F1, answer rate, tool calls and terminations of one dataset's trajectories."""
    n = len(records)
    if n == 0:
        return {"n": 0, "em": 0.0, "f1": 0.0, "answer_rate": 0.0, "mean_tool_calls": 0.0, "termination": {}}
    return {
        "n": n,
        "em": sum(r["evaluation"]["em"] for r in records) / n,
        "f1": sum(r["evaluation"]["f1"] for r in records) / n,
        "answer_rate": sum(r["termination"] == "answer" for r in records) / n,
        "mean_tool_calls": sum(r["num_tool_calls"] for r in records) / n,
        "termination": dict(Counter(r["termination"] for r in records)),
    }


def summarize_datasets(per_dataset: dict[str, dict]) -> dict:
    """Averages over datasets (each dataset weighs the same, as in the paper's "Avg." column)."""
    scored = [s for s in per_dataset.values() if s["n"]]
    return {
        "em": statistics.fmean(s["em"] for s in scored) if scored else 0.0,
        "f1": statistics.fmean(s["f1"] for s in scored) if scored else 0.0,
        "n": sum(s["n"] for s in scored),
        "per_dataset": per_dataset,
    }


def evaluate_policy(policy, datasets: dict[str, list[dict]], retriever, limits: Limits, tokenizer=None,
                    records_out: list | None = None) -> dict:
    """Run `policy` on every dataset and summarise; trajectories are appended to `records_out` when given."""
    per_dataset = {}
    for name, questions in datasets.items():
        records = run_qa(questions, retriever, policy, limits, tokenizer=tokenizer, progress=True)
        per_dataset[name] = summarize_records(records)
        if records_out is not None:
            records_out.extend(records)
    return summarize_datasets(per_dataset)


def read_base_metrics(path: str | Path) -> dict | None:
    """The base checkpoint's OOD metrics, or None when that file does not exist (yet); a clear error when the file is
    something else (by default the base's file is looked for beside `--out`, where another stage's `base.json`
    may sit)."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        metrics = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise UserError(f"{path} is not JSON ({error}): re-run `star ood-qa --name base`, or name the base's OOD "
                        "metrics with --base-metrics") from None
    if not isinstance(metrics, dict) or not {"em", "f1"} <= set(metrics):
        raise UserError(f"{path} is not an OOD QA metrics file (no `em`/`f1`): write the checkpoint's metrics to "
                        "its own folder (metrics/ood_qa/<name>.json) or name the base's with --base-metrics")
    return metrics


def evaluate_checkpoint(model: str | Path, params: OODQAParams, qa_dir: str | Path,
                        base_metrics: dict | None = None, records_out: list | None = None) -> dict:
    """OOD QA metrics of a checkpoint: `em`, `f1` (averages over datasets), `per_dataset`, and the alignment tax
    against `base_metrics` when given (the contract of `metrics/ood_qa/<checkpoint>.json`)."""
    policy, tokenizer = load_checkpoint_policy(model, params.decoding, params.limits.max_context_tokens)
    metrics = evaluate_policy(policy, load_datasets(params, qa_dir), make_retriever(params.retriever, qa_dir),
                              params.limits.to_limits(), tokenizer=tokenizer, records_out=records_out)
    if base_metrics is not None:
        metrics.update(alignment_tax(base_metrics, metrics))
    return metrics
