"""QA episodes through the shared agent loop: one question per episode, scored by EM/F1 when it ends."""
from __future__ import annotations

from components.agent.loop import Episode, Limits, run_episodes
from components.evaluation.qa.env import QAEnv, score_record
from components.evaluation.qa.retriever import Retriever


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
