"""The learning-comparison routine (gspo.core.comparison) against hand-computed values."""

from __future__ import annotations

import math
import statistics

import pytest

from gspo.core.comparison import (
    MIN_SEEDS,
    bootstrap_interval,
    compare_paired,
    mde,
    ratio_interval,
    t_quantile,
)


@pytest.mark.parametrize(
    "p, df, want, tol",
    [
        # Exact values (tables; scipy.stats.t.ppf).
        (0.975, 1, 12.706205, 1e-5),
        (0.975, 2, 4.302653, 1e-5),
        (0.80, 2, 1.060660, 1e-5),
        (0.975, 3, 3.182446, 4e-3),  # the expansion's worst case
        (0.975, 9, 2.262157, 3e-5),
        (0.80, 9, 0.883404, 3e-5),
        (0.975, 19, 2.093024, 1e-5),
        (0.975, 1000, 1.962339, 1e-5),
        (0.025, 9, -2.262157, 3e-5),
    ],
)
def test_t_quantile(p, df, want, tol):
    assert t_quantile(p, df) == pytest.approx(want, abs=tol)


def test_mde_is_the_paired_t_test_sum_of_quantiles_times_se():
    # n = 10: (t_9(0.975) + t_9(0.80)) * SE = (2.262157 + 0.883404) * 0.01
    assert mde(0.01, 10) == pytest.approx(0.0314556, abs=1e-6)
    assert math.isnan(mde(0.01, 1))


def test_bootstrap_interval_small_cases_by_enumeration():
    # Two values: the resampled mean is 0, 0.5 or 1 with probability 1/4, 1/2, 1/4, so the
    # 2.5% and 97.5% quantiles are 0 and 1.
    assert bootstrap_interval([0.0, 1.0]) == (0.0, 1.0)
    assert bootstrap_interval([0.3] * 5) == (0.3, 0.3)
    # Reproducible: a fixed RNG seed.
    values = [0.01 * i for i in range(12)]
    assert bootstrap_interval(values) == bootstrap_interval(values)


def test_bootstrap_interval_near_normal_for_many_seeds():
    values = [(-1) ** i * (i % 7) * 0.01 + 0.02 for i in range(40)]
    lo, hi = bootstrap_interval(values)
    m = statistics.fmean(values)
    se = statistics.stdev(values) / math.sqrt(len(values))
    # The percentile interval is ~ mean ± 1.96 SE * sqrt((n-1)/n) for a symmetric sample.
    assert lo == pytest.approx(m - 1.96 * se, abs=0.25 * se)
    assert hi == pytest.approx(m + 1.96 * se, abs=0.25 * se)


def test_compare_paired_hand_computed():
    a = {0: 0.40, 1: 0.35, 2: 0.38, 3: 0.50, 9: 0.1}
    b = {0: 0.36, 1: 0.37, 2: 0.35, 3: 0.44, 4: 0.9, 9: math.nan}
    c = compare_paired(a, b, names=("gspo", "trl"), problems=800)
    # Seeds 0-3 are paired (4 has no a, 9 a NaN): d = 0.04, -0.02, 0.03, 0.06.
    assert c.seeds == (0, 1, 2, 3)
    assert c.differences == pytest.approx((0.04, -0.02, 0.03, 0.06))
    assert c.mean == pytest.approx(0.0275)
    # sd = sqrt(((0.0125)^2 + (0.0475)^2 + (0.0025)^2 + (0.0325)^2) / 3) = 0.0340343
    assert c.se == pytest.approx(0.0340343 / 2, abs=1e-6)
    # MDE with df 3: (3.182446 + 0.978472) * SE
    assert c.mde == pytest.approx((3.182446 + 0.978472) * c.se, rel=2e-3)
    assert c.wins == (3, 1, 0)
    assert c.verdict == "cannot tell at this power"
    line = c.line()
    assert "MDE" in line and "fewer than 10 seeds" in line and "800 problems" in line


def test_a_difference_needs_ten_seeds_and_an_interval_without_zero():
    up = {s: 0.05 + 0.001 * s for s in range(MIN_SEEDS)}
    zero = dict.fromkeys(range(MIN_SEEDS), 0.0)
    assert compare_paired(up, zero).verdict == "a higher"
    assert compare_paired(zero, up).verdict == "a lower"
    nine = {s: v for s, v in up.items() if s < MIN_SEEDS - 1}
    assert compare_paired(nine, zero).verdict == "cannot tell at this power"
    mixed = {s: (0.01 if s % 2 else -0.01) for s in range(12)}
    c = compare_paired(mixed, dict.fromkeys(range(12), 0.0))
    assert c.low < 0 < c.high and c.verdict == "cannot tell at this power"
    assert "MDE" in c.line() and "fewer than" not in c.line()


def test_a_shared_baseline_is_said():
    c = compare_paired({0: 1.0, 1: 0.5}, {0: 0.5, 1: 0.5}, names=("x", "y"), shared_baseline=3)
    assert "y's runs shared by 3 comparisons" in c.line()
    assert c.to_json()["shared_baseline"] == 3


def test_ratio_interval_is_the_t_interval_of_the_mean_log_ratio():
    # Per-round log-ratios 0.1, 0.0, 0.2 (times 2, 3, 4 against 2e^0.1, 3, 4e^0.2): mean 0.1,
    # sd 0.1, SE 0.1 / sqrt(3) = 0.0577350; t_2(0.975) = 4.302653 -> half-width 0.2484138.
    iv = ratio_interval([2 * math.exp(0.1), 3.0, 4 * math.exp(0.2)], [2.0, 3.0, 4.0])
    assert iv.rounds == 3
    assert iv.ratio == pytest.approx(math.exp(0.1))  # 1.1051709
    assert iv.low == pytest.approx(math.exp(0.1 - 0.2484138), rel=1e-6)  # 0.8620743
    assert iv.high == pytest.approx(math.exp(0.1 + 0.2484138), rel=1e-6)  # 1.4168184
    assert iv.half_width == pytest.approx(1.4168184 / 1.1051709 - 1, rel=1e-6)
    assert iv.text() == "1.11x (0.86-1.42)"
    assert iv.to_json()["ci95"] == [iv.low, iv.high]


def test_ratio_interval_two_rounds_and_degenerate_cases():
    # Log-ratios 0.0 and 0.1: mean 0.05, SE = sd / sqrt(2) = 0.05, t_1(0.975) = 12.706205.
    iv = ratio_interval([1.0, math.exp(0.1)], [1.0, 1.0])
    assert (iv.low, iv.high) == pytest.approx((0.5569330, 1.9843874), rel=1e-6)
    # The same ratio every round: a zero-width interval at it.
    iv = ratio_interval([2.0, 4.0, 6.0], [1.0, 2.0, 3.0])
    assert (iv.ratio, iv.low, iv.high) == pytest.approx((2.0, 2.0, 2.0))
    assert iv.text() == "2.00x (2.00-2.00)"
    # One usable round: the ratio, no interval; missing figures drop their round.
    iv = ratio_interval([3.0, None, math.nan], [1.5, 1.0, 1.0])
    assert iv.rounds == 1 and iv.ratio == pytest.approx(2.0) and math.isnan(iv.low)
    assert iv.text() == "2.00x"
    assert ratio_interval([None], [1.0]) is None
    with pytest.raises(ValueError):
        ratio_interval([1.0], [1.0, 2.0])
