"""The thesis's statistics (fedcare.evaluation.statistics) against hand-computed values: the
example-weighted mean and SD, and rank sums with a tie and NaN."""

import math

import pytest

from fedcare.evaluation.statistics import rank_sums, rank_units, weighted_mean_sd


def test_weighted_mean_sd_hand_example():
    mean, sd = weighted_mean_sd([0.5, 1.0, 0.0], [2, 1, 1])
    assert mean == pytest.approx((0.5 * 2 + 1.0 + 0.0) / 4)  # 0.5
    # plain population SD of the values (not weighted): mean 0.5, squared deviations 0, .25, .25
    assert sd == pytest.approx(math.sqrt(0.5 / 3))
    # NaN values are dropped with their weights
    assert weighted_mean_sd([0.2, float("nan")], [1, 5]) == (pytest.approx(0.2), 0.0)
    m, s = weighted_mean_sd([], [])
    assert math.isnan(m) and math.isnan(s)


def test_rank_sums_hand_example_with_tie_and_nan():
    table = {
        "A": {1: 0.5, 2: 0.9, 3: 0.1, 4: float("nan")},
        "B": {1: 0.7, 2: 0.9, 3: 0.3, 4: 0.5, 5: 0.9},
        "C": {1: 0.6, 2: 0.2, 3: 0.2, 4: 0.4, 5: 0.1},
    }
    # unit 1: A 0, C 1, B 2 | unit 2: C 0, A and B tie for ranks 1 and 2 -> 1.5 each
    # unit 3: A 0, C 1, B 2 | unit 4: A is NaN -> skipped | unit 5: A missing -> skipped
    assert rank_sums(table) == {"A": 1.5, "B": 5.5, "C": 2.0}
    assert rank_units(table) == [1, 2, 3]
    assert list(rank_sums(table)) == ["A", "B", "C"]
