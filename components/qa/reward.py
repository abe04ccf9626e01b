"""The QA reward of a finished episode: exact match and token F1 of its answer against the golden answers."""
from __future__ import annotations

from components.answer_match import exact_match, f1_score


def score_record(record: dict, golden_answers: list[str]) -> dict:
    """The QA evaluation of a finished episode: EM and F1 of its answer (no answer scores 0)."""
    answer = record.get("answer")
    return {"em": exact_match(answer, golden_answers), "f1": f1_score(answer, golden_answers)}
