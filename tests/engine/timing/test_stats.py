"""kopt.timing.stats on synthetic samples with known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kopt.timing import stats
from kopt.timing.stats import StopRule


def _normal(n, med=10.0, sd=0.5, seed=0):
    return np.random.default_rng(seed).normal(med, sd, n)


def test_median_ci_covers_true_median_and_shrinks_with_n():
    widths = []
    for n in (50, 500, 5000):
        lo, hi = stats.median_ci(_normal(n))
        assert lo <= 10.0 <= hi
        widths.append(hi - lo)
    assert widths[0] > widths[1] > widths[2]
    # Asymptotic width of the median's 95% CI: 2 * 1.96 * sqrt(pi/2) * sd / sqrt(n).
    assert widths[2] == pytest.approx(2 * 1.96 * math.sqrt(math.pi / 2) * 0.5 / math.sqrt(5000), rel=0.25)


def test_median_ci_coverage_near_nominal():
    hits = sum(lo <= 10.0 <= hi for lo, hi in (stats.median_ci(_normal(60, seed=s)) for s in range(400)))
    assert 0.92 <= hits / 400 <= 0.995          # exact binomial CIs are slightly conservative


def test_median_ci_small_and_exact_order_statistics():
    assert stats.median_ci([3.0]) == (3.0, 3.0)
    assert stats.median_ci([5, 1, 4, 2, 3]) == (1.0, 5.0)      # n < 6: widest interval
    # n = 10 at 95%: P(B <= 1) = 11/1024 <= 0.025 < P(B <= 2), so r = 2: x_(2), x_(9).
    assert stats.median_ci(list(range(1, 11))) == (2.0, 9.0)
    with pytest.raises(ValueError):
        stats.median_ci([])


def test_rel_iqr_and_noisy():
    assert stats.rel_iqr([1.0] * 10) == 0.0
    assert stats.rel_iqr([1, 2, 3, 4, 5]) == pytest.approx((4 - 2) / 3)
    x = _normal(20000, med=10.0, sd=1.0)
    assert stats.rel_iqr(x) == pytest.approx(1.349 / 10, rel=0.05)   # IQR of a normal = 1.349 sd
    assert stats.noisy(0.06) and not stats.noisy(0.05) and not stats.noisy(0.01)


def test_stop_rule_stops_early_on_tight_data():
    rule = StopRule()
    tight = list(_normal(150, med=1.0, sd=0.001))        # 150 ms of samples, ~0.1% spread
    assert rule.should_stop(tight, elapsed_s=0.2)
    assert not rule.should_stop(tight[:50], elapsed_s=0.2)           # under min_samples
    small = [0.0001] * 200                                             # 20 us total: under min_time
    assert not rule.should_stop(small, elapsed_s=0.2)


def test_stop_rule_wide_data_runs_to_the_cap():
    rule = StopRule()
    wide = list(np.random.default_rng(1).lognormal(0.0, 1.0, 4000))
    assert not rule.should_stop(wide, elapsed_s=1.0)
    assert rule.should_stop(wide, elapsed_s=5.0)                       # time cap
    more = list(np.random.default_rng(1).lognormal(0.0, 1.0, 5000))
    assert rule.should_stop(more, elapsed_s=1.0)                       # sample cap


def test_stop_rule_split_keeps_totals():
    r = StopRule().split(6)
    assert r.min_samples == 17 and r.max_samples == 834
    assert r.max_time_s == pytest.approx(5.0 / 6)
    assert r.target_rel_ci == pytest.approx(0.005 * math.sqrt(6))


def test_bootstrap_ci_constant_is_a_point_and_seeded():
    assert stats.bootstrap_ci([2.0] * 8) == (2.0, 2.0)
    x = _normal(40)
    assert stats.bootstrap_ci(x, seed=3) == stats.bootstrap_ci(x, seed=3)
    lo, hi = stats.bootstrap_ci(x)
    assert lo < np.median(x) < hi
    lo2, hi2 = stats.bootstrap_ci(x, stat=lambda v: float(np.mean(v)), n_boot=300)   # no axis arg
    assert lo2 < 10.0 < hi2


def test_bootstrap_ci_large_input_is_chunked():
    lo, hi = stats.bootstrap_ci(_normal(5000), n_boot=2000)
    assert lo < 10.0 < hi and hi - lo < 0.1


def test_paired_speedup():
    a = [[1.0, 1.0, 1.1], [1.0, 0.9, 1.0]]
    b = [[2.0, 2.0, 2.2], [2.0, 1.8, 2.0]]
    ps = stats.paired_speedup(a, b)
    assert ps.ratios == [2.0, 2.0]
    assert ps.speedup == 2.0
    lo, hi = ps.ci   # the inner resampling sees 0.9-1.1 inside the rounds: an interval around 2, not a point
    assert lo < 2.0 < hi and 1.6 < lo and hi < 2.5
    exact = stats.paired_speedup([[1.0] * 5] * 6, [[2.0] * 5] * 6)
    assert exact.ci == (2.0, 2.0)    # no noise anywhere: a point
    with pytest.raises(ValueError):
        stats.paired_speedup(a, b[:1])
    with pytest.raises(ValueError):
        stats.paired_speedup([[1.0], []], [[1.0], [1.0]])


def _aa_experiment(rng, rounds=6, n=150, drift=0.002, noise=0.01):
    """One synthetic A/A pair: per-round drift shared by both sides, lognormal sample noise."""
    a, b = [], []
    for _ in range(rounds):
        level = 10.0 * (1 + drift * rng.standard_normal())
        a.append(level * np.exp(noise * rng.standard_normal(n)))
        b.append(level * np.exp(noise * rng.standard_normal(n)))
    return a, b


def test_paired_ci_covers_one_for_a_against_itself():
    """Known answer 1: over many synthetic A/A pairs the 95% CI contains 1 at least ~95% of the time,
    and never less often than the bootstrap of the six ratios alone (which treats each as exact)."""
    rng = np.random.default_rng(1)
    hits = ratio_only = 0
    trials = 120
    for t in range(trials):
        a, b = _aa_experiment(rng)
        lo, hi = stats.paired_bootstrap_ci(a, b, n_boot=400, seed=t)
        hits += lo <= 1.0 <= hi
        r = [np.median(y) / np.median(x) for x, y in zip(a, b)]
        rlo, rhi = stats.bootstrap_ci(r, n_boot=400, seed=t)
        ratio_only += rlo <= 1.0 <= rhi
    assert hits / trials >= 0.93
    assert ratio_only <= hits


@pytest.mark.parametrize("n", [1, 2, 7, 40, 41])
def test_boot_medians_match_brute_force_resampling(n):
    """The order-statistic shortcut draws the same distribution as resampling and taking np.median."""
    rng = np.random.default_rng(n)
    x = rng.lognormal(size=n)
    fast = stats._boot_medians(x, 20000, np.random.default_rng(0))
    slow = np.median(x[np.random.default_rng(1).integers(0, n, size=(20000, n))], axis=1)
    # the same probability on every value a resample median can take (the midpoints too, for even n)
    values = np.union1d(fast, slow)
    p_fast = np.array([(fast == v).mean() for v in values])
    p_slow = np.array([(slow == v).mean() for v in values])
    assert np.abs(np.cumsum(p_fast) - np.cumsum(p_slow)).max() < 0.02


def test_paired_ci_finds_a_known_speedup():
    """Known answer 2: b is 5% slower than a in every round; the CI holds 1.05 and excludes 1."""
    rng = np.random.default_rng(2)
    a, b = _aa_experiment(rng)
    b = [x * 1.05 for x in b]
    ps = stats.paired_speedup(a, b)
    lo, hi = ps.ci
    assert 1.0 < lo < 1.05 < hi < 1.1
    assert abs(ps.speedup - 1.05) < 0.01


@pytest.mark.parametrize(
    "speedup, ci, aa, expected",
    [
        (1.05, (1.02, 1.08), 0.0, True),      # CI excludes 1, effect 5% >= 1%
        (1.05, (0.99, 1.08), 0.0, False),     # CI includes 1
        (1.005, (1.001, 1.009), 0.0, False),  # below the 1% floor
        (1.05, (1.02, 1.08), 0.02, False),    # 5% < 3 x 2% A/A spread
        (1.07, (1.02, 1.10), 0.02, True),     # 7% >= 6%
        (0.90, (0.85, 0.95), 0.0, False),     # a slowdown
        (1.02, (1.01, 1.03), None, True),     # no A/A measurement: floor only
    ],
)
def test_is_improvement_truth_table(speedup, ci, aa, expected):
    assert stats.is_improvement(speedup, ci, aa) is expected
