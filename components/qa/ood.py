"""The out-of-domain QA set: its params (params/ood_qa.yaml, section `ood_qa`), the offline QA data (the
encyclopedia corpus and its question sets, checked with the QA expert), the configured datasets, and a policy's
per-question results on them. The ood-qa stage (components/evaluation/ood_qa.py) reaches this module through the
environment registry and summarises the results (intervals, the alignment tax).

    metrics = build_qa_data(OODQAParams(), "data/qa")
    results = evaluate_policy(policy, load_datasets(params, "data/qa"), retriever, limits)
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Literal

from pydantic import Field

from components.agent.loop import Limits
from components.agent.params import DecodingParams, LimitsParams
from components.errors import UserError
from components.params import Params
from components.qa import corpus as qa_corpus
from components.qa.env import IN_CONTEXT_EXAMPLES
from components.qa.evaluate import QAMode, run_qa
from components.qa.expert import QAExpertPolicy
from components.qa.tasks import dump_jsonl, load_hf_dataset, load_jsonl_dataset
from components.retrieval import BM25Retriever, RetrieverParams


class CorpusParams(Params):
    """Size and seed of a generated encyclopedia."""

    seed: int = 0
    num_people: int = Field(300, ge=2)
    num_towns: int = Field(60, ge=2)
    num_organisations: int = Field(40, ge=1)


class DatasetParams(Params):
    """One QA dataset: `generated` (data/qa/questions/<name>.jsonl), a local `jsonl` file (`path`), or `hf`
    (FlashRAG's release on the Hub, or with `path` a local clone of it)."""

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
    expert = evaluate_policy(QAExpertPolicy(), evaluation.questions, retriever, params.limits.to_limits())
    metrics["expert_em"] = dataset_em(expert)
    return metrics


def dataset_em(results: list[dict]) -> dict[str, float]:
    """The EM of per-question results per dataset, in order of first appearance."""
    groups: dict[str, list[dict]] = {}
    for result in results:
        groups.setdefault(result["dataset"], []).append(result)
    return {dataset: sum(r["em"] for r in group) / len(group) for dataset, group in groups.items()}


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
            examples = load_hf_dataset(spec.name, spec.split, limit=limit, path=spec.path)
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
