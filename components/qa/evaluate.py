"""QA episodes through the shared agent loop: one question per episode, scored by EM/F1 when it ends.

Mode `search`: the model searches with the tool (`QAEnv`). Mode `in_context`: the question's top-k passages from the
same retriever are placed in the conversation and the model answers in one turn (`InContextQAEnv`); each record
then says whether a golden answer was in those passages (`answer_in_context`).
"""
from __future__ import annotations

from typing import Literal

from components.agent.loop import Episode, Limits, run_episodes
from components.qa.env import IN_CONTEXT_EXAMPLES, InContextQAEnv, QAEnv, answer_in_passages
from components.qa.reward import score_record
from components.retrieval import Retriever

QAMode = Literal["search", "in_context"]


def _meta(question: dict) -> dict:
    return {**question, "level": question.get("dataset")}


def qa_episodes(questions: list[dict], retriever: Retriever) -> list[Episode]:
    """One search episode per question; `meta` carries the question record (the expert and the scorer read it)."""
    return [Episode(idx=i, env=QAEnv(q["question"], retriever), meta=_meta(q), episode_id=str(q.get("id", i)))
            for i, q in enumerate(questions)]


def in_context_episodes(questions: list[dict], retriever: Retriever,
                        examples: int = len(IN_CONTEXT_EXAMPLES)) -> list[Episode]:
    """One in-context episode per question, its passages retrieved for the question text (one batched search);
    `meta` also carries whether a golden answer is in them."""
    retrieved = retriever.batch_search([q["question"] for q in questions])
    return [Episode(idx=i, env=InContextQAEnv(q["question"], passages, examples),
                    meta={**_meta(q), "answer_in_context": answer_in_passages(passages, q["golden_answers"])},
                    episode_id=str(q.get("id", i)))
            for i, (q, passages) in enumerate(zip(questions, retrieved))]


def evaluate_qa(episode: Episode, record: dict) -> dict:
    """The loop's `evaluate` callback: EM and F1 against the question's golden answers."""
    return score_record(record, episode.meta["golden_answers"])


def run_qa(questions: list[dict], retriever: Retriever, policy, limits: Limits, tokenizer=None,
           progress: bool = True, mode: QAMode = "search", examples: int = len(IN_CONTEXT_EXAMPLES)) -> list[dict]:
    """Answer every question with `policy` through `run_episodes`, in `mode`; each record gets `id`, `dataset`,
    `question`, `golden_answers`, `mode` and `evaluation: {"em", "f1"}` (and `answer_in_context` in mode
    `in_context`). `examples`: the worked examples an in-context conversation opens with."""
    episodes = (in_context_episodes(questions, retriever, examples) if mode == "in_context"
                else qa_episodes(questions, retriever))
    records = run_episodes(episodes, policy, limits=limits, tokenizer=tokenizer, evaluate=evaluate_qa,
                           progress=progress)
    for question, episode, record in zip(questions, episodes, records):
        record.update({"id": question.get("id"), "dataset": question.get("dataset"), "mode": mode,
                       "question": question["question"], "golden_answers": question["golden_answers"]})
        if "answer_in_context" in episode.meta:
            record["answer_in_context"] = episode.meta["answer_in_context"]
    return records
