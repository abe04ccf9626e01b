"""components/stats.py: the intervals and paired differences the evaluations report."""
import math

import pytest

from components.stats import bootstrap_interval, mean_of_means, paired_difference, rate_interval, wilson_interval


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


def test_the_bootstrap_interval_of_a_rate_is_close_to_the_normal_one_and_reproducible():
    outcomes = [1.0] * 30 + [0.0] * 70  # 30% of 100: 0.30 +- 1.96 * sqrt(0.3 * 0.7 / 100) = [0.210, 0.390]
    low, high = bootstrap_interval({"nq": outcomes}, resamples=4000, seed=1)
    assert low == pytest.approx(0.21, abs=0.012) and high == pytest.approx(0.39, abs=0.012)
    assert bootstrap_interval({"nq": outcomes}, seed=7) == bootstrap_interval({"nq": outcomes}, seed=7)
    assert bootstrap_interval({"nq": [0.25] * 9}) == (0.25, 0.25)  # no spread, no doubt


def test_the_bootstrap_resamples_within_each_group_and_weighs_groups_the_same():
    groups = {"big": [1.0] * 1000, "small": [0.0] * 10}  # the mean of means is 0.5, not 1000/1010
    assert mean_of_means(groups) == 0.5 and bootstrap_interval(groups) == (0.5, 0.5)
    with pytest.raises(ValueError, match="at least one group"):
        bootstrap_interval({"empty": []})
    with pytest.raises(ValueError, match="resamples"):
        bootstrap_interval({"nq": [1.0]}, resamples=0)
