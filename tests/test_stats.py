"""components/stats.py: the intervals and paired differences the evaluations report."""
import math

import pytest

from components.stats import paired_difference, rate_interval, wilson_interval


def test_the_wilson_interval_matches_the_textbook_numbers():
    low, high = wilson_interval(4, 40)  # 10%: the tiny preset's final-pass target on 40 queries
    assert (round(low, 4), round(high, 4)) == (0.0396, 0.2305)
    assert wilson_interval(0, 40)[0] == 0.0 and round(wilson_interval(0, 40)[1], 4) == 0.0876  # not empty at 0
    assert wilson_interval(40, 40)[1] == 1.0 and round(wilson_interval(40, 40)[0], 4) == 0.9124
    assert wilson_interval(0, 0) == (0.0, 1.0)  # no items: nothing is known


def test_a_rate_interval_reads_a_rate_of_n_items():
    assert rate_interval(0.1, 40) == [0.0396, 0.2305]
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(5, 4)


def test_the_paired_difference_cancels_what_both_share():
    result = paired_difference([1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 0.0])
    assert result["n"] == 4 and result["mean"] == 0.5 and result["se"] == pytest.approx(0.2887, abs=1e-4)
    assert math.isnan(paired_difference([1.0], [0.0])["se"])
    with pytest.raises(ValueError, match="same items"):
        paired_difference([1.0, 2.0], [1.0])
