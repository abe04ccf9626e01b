"""Exact match and token F1 with the standard SQuAD answer normalisation (as in Search-R1 and FlashRAG): how the QA
and Tool-Star environments score a short answer against its golden answers."""
from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Iterable

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lowercase, drop punctuation, drop articles, collapse whitespace.

    Unicode is put in NFKC form first so that e.g. a non-breaking space or a full-width digit compares equal to
    its plain form (the SQuAD script leaves them alone; NFKC only merges characters that render the same).
    """
    text = unicodedata.normalize("NFKC", text).lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _as_list(golden_answers: str | Iterable[str]) -> list[str]:
    return [golden_answers] if isinstance(golden_answers, str) else list(golden_answers)


def exact_match(prediction: str | None, golden_answers: str | Iterable[str]) -> float:
    """1.0 if the normalised prediction equals any normalised golden answer, else 0.0 (None counts as wrong)."""
    if prediction is None:
        return 0.0
    predicted = normalize_answer(prediction)
    return float(any(predicted == normalize_answer(gold) for gold in _as_list(golden_answers)))


def _token_f1(prediction: str, gold: str) -> float:
    predicted_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not predicted_tokens or not gold_tokens:
        return float(predicted_tokens == gold_tokens)
    common = Counter(predicted_tokens) & Counter(gold_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(predicted_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str | None, golden_answers: str | Iterable[str]) -> float:
    """Token F1 against the best-matching golden answer (None counts as 0)."""
    if prediction is None:
        return 0.0
    return max((_token_f1(prediction, gold) for gold in _as_list(golden_answers)), default=0.0)
