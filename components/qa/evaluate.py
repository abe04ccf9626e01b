"""QA episodes through the shared agent loop: one question per episode, scored by EM/F1 when it ends, and the
alignment tax (a trained checkpoint's scores against the base model's)."""
from __future__ import annotations

from components.agent.loop import Episode, Limits, run_episodes
from components.qa.env import QAEnv
from components.qa.reward import score_record
from components.retrieval import Retriever


def qa_episodes(questions: list[dict], retriever: Retriever) -> list[Episode]:
    """One episode per question; `meta` carries the question record (the expert and the scorer read it)."""
    return [Episode(idx=i, env=QAEnv(q["question"], retriever), meta={**q, "level": q.get("dataset")},
                    episode_id=str(q.get("id", i)))
            for i, q in enumerate(questions)]


def evaluate_qa(episode: Episode, record: dict) -> dict:
    """The loop's `evaluate` callback: EM and F1 against the question's golden answers."""
    return score_record(record, episode.meta["golden_answers"])


def run_qa(questions: list[dict], retriever: Retriever, policy, limits: Limits, tokenizer=None,
           progress: bool = True) -> list[dict]:
    """Answer every question with `policy` through `run_episodes`; each record gets `id`, `dataset`,
    `question`, `golden_answers` and `evaluation: {"em", "f1"}`."""
    records = run_episodes(qa_episodes(questions, retriever), policy, limits=limits, tokenizer=tokenizer,
                           evaluate=evaluate_qa, progress=progress)
    for question, record in zip(questions, records):
        record.update({"id": question.get("id"), "dataset": question.get("dataset"),
                       "question": question["question"], "golden_answers": question["golden_answers"]})
    return records


def alignment_tax(base: dict, trained: dict) -> dict:
    """Alignment tax = base score - trained score, absolute and relative to base (EM, and F1 alongside).

    Positive means training cost general ability; the relative tax is None when the base scores 0.
    """
    def rel(b: float, t: float) -> float | None:
        return (b - t) / b if b else None

    return {
        "alignment_tax_abs": base["em"] - trained["em"],
        "alignment_tax_rel": rel(base["em"], trained["em"]),
        "alignment_tax_f1_abs": base["f1"] - trained["f1"],
        "alignment_tax_f1_rel": rel(base["f1"], trained["f1"]),
        "base_em": base["em"],
        "base_f1": base["f1"],
    }
