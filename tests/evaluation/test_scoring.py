"""EM and F1 agree with the standard SQuAD normalisation on tricky answers."""
from __future__ import annotations

import pytest

from components.answer_match import exact_match, f1_score, normalize_answer


@pytest.mark.parametrize("text, normalised", [
    ("The Eiffel Tower", "eiffel tower"),            # article and case
    ("  an   apple\tpie \n", "apple pie"),           # articles and whitespace
    ("U.S.A.", "usa"),                               # punctuation is dropped, not replaced by spaces
    ("rock-'n'-roll!", "rocknroll"),
    ("Theatre", "theatre"),                          # "the" only as a whole word
    ("A", ""),                                       # an answer that is only an article
    ("1,024", "1024"),                               # numbers lose their separators
    ("3.14", "314"),
    ("Zürich", "zürich"),                            # letters beyond ASCII are kept
    ("Ｔｏｋｙｏ\u00a0２０２０", "tokyo 2020"),           # full-width letters/digits and a no-break space (NFKC)
    ("", ""),
])
def test_normalisation_matches_squad(text: str, normalised: str):
    assert normalize_answer(text) == normalised


@pytest.mark.parametrize("prediction, golden, em", [
    ("the Beatles", ["Beatles"], 1.0),
    ("Beatles.", "The Beatles", 1.0),               # a single string is one golden answer
    ("Paul McCartney", ["John Lennon", "paul mccartney"], 1.0),  # any of several golden answers
    ("McCartney", ["Paul McCartney"], 0.0),         # partial answers are not exact
    ("1984", ["nineteen eighty-four"], 0.0),        # no number-word conversion (as in SQuAD)
    ("", ["Paris"], 0.0),
    ("", [""], 1.0),
    (None, ["Paris"], 0.0),                          # no answer given
    ("Paris", [], 0.0),                              # no golden answers
])
def test_exact_match(prediction, golden, em: float):
    assert exact_match(prediction, golden) == em


@pytest.mark.parametrize("prediction, golden, f1", [
    ("Paul McCartney", ["Paul McCartney"], 1.0),
    ("McCartney", ["Paul McCartney"], pytest.approx(2 / 3)),  # precision 1, recall 1/2
    ("Sir Paul McCartney", ["Paul McCartney"], pytest.approx(0.8)),  # precision 2/3, recall 1
    ("the the", ["a"], 1.0),                          # both normalise to nothing
    ("John", ["Paul McCartney", "John Lennon"], pytest.approx(2 / 3)),  # the best golden answer counts
    ("Ringo", ["Paul McCartney"], 0.0),
    (None, ["Paul"], 0.0),
])
def test_token_f1(prediction, golden, f1):
    assert f1_score(prediction, golden) == f1
