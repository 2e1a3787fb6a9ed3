"""Statistics for timings: median CIs, spread, the stopping rule, paired speedups.

Pure Python + numpy (no torch), so everything here is unit-tested on synthetic samples.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

import numpy as np

#: Relative IQR above which a timing is flagged noisy (DESIGN.md "Measuring").
NOISY_REL_IQR = 0.05
#: Smallest effect ever called an improvement, whatever the A/A spread says.
MIN_EFFECT = 0.01


@lru_cache(maxsize=64)
def _binom_cdf(n: int) -> np.ndarray:
    """P(B <= k) for B ~ Binomial(n, 1/2), k = 0..n, computed in log space (exact up to float)."""
    k = np.arange(n + 1)
    logpmf = (
        math.lgamma(n + 1)
        - np.array([math.lgamma(i + 1) + math.lgamma(n - i + 1) for i in k])
        - n * math.log(2.0)
    )
    return np.cumsum(np.exp(logpmf))


def median_ci(samples: Sequence[float], conf: float = 0.95) -> tuple[float, float]:
    """Distribution-free CI of the median: order statistics x_(r), x_(n+1-r) from the binomial."""
    x = np.sort(np.asarray(samples, dtype=float))
    n = x.size
    if n == 0:
        raise ValueError("median_ci needs at least one sample")
    alpha = 1.0 - conf
    # [x_(r), x_(n+1-r)] (1-based) covers the median with probability 1 - 2 P(B <= r-1);
    # take the largest r whose tail stays within alpha/2 (the tightest interval with >= conf).
    cdf = _binom_cdf(n)
    ok = np.nonzero(cdf <= alpha / 2)[0]          # values of r-1 that are allowed
    if ok.size == 0:                              # n too small (< 6 at 95%): widest interval we have
        return float(x[0]), float(x[-1])
    r = int(ok[-1]) + 1
    return float(x[r - 1]), float(x[n - r])


def ci_rel(samples: Sequence[float], conf: float = 0.95) -> float:
    """Half-width of the median's CI relative to the median (inf when the median is 0)."""
    lo, hi = median_ci(samples, conf)
    med = float(np.median(samples))
    return (hi - lo) / 2.0 / med if med > 0 else math.inf


def rel_iqr(samples: Sequence[float]) -> float:
    """(q3 - q1) / median; 0 for a single sample, inf when the median is 0."""
    x = np.asarray(samples, dtype=float)
    if x.size == 0:
        raise ValueError("rel_iqr needs at least one sample")
    q1, med, q3 = np.percentile(x, [25, 50, 75])
    return float((q3 - q1) / med) if med > 0 else math.inf


def noisy(rel_iqr_value: float) -> bool:
    """Whether a spread is too wide to trust a median to a few percent (rel. IQR > 5%)."""
    return rel_iqr_value > NOISY_REL_IQR


@dataclass
class StopRule:
    """When to stop sampling: enough samples, enough measured time, and a tight median CI.

    Defaults follow nvbench's spirit (DESIGN.md): >=100 samples and >=100 ms of measured time,
    stop once the 95% CI of the median is within +-0.5%, cap at 5 s of wall time / 5000 samples.
    """

    min_samples: int = 100
    min_time_s: float = 0.1
    target_rel_ci: float = 0.005
    max_time_s: float = 5.0
    max_samples: int = 5000

    def capped(self, n: int, elapsed_s: float) -> bool:
        """Whether a hard cap (sample count or wall time) is hit."""
        return n >= self.max_samples or elapsed_s >= self.max_time_s

    def should_stop(self, samples_ms: Sequence[float], elapsed_s: float) -> bool:
        """True once the minimums are met and the CI is tight enough, or once a cap is hit."""
        n = len(samples_ms)
        if self.capped(n, elapsed_s):
            return True
        if n < max(self.min_samples, 1) or sum(samples_ms) / 1e3 < self.min_time_s:
            return False
        return ci_rel(samples_ms) <= self.target_rel_ci

    def split(self, parts: int) -> StopRule:
        """The rule for one of `parts` interleaved rounds, so all rounds together meet this rule.

        Counts and times divide; the per-round CI target widens by sqrt(parts) because the
        pooled median's CI shrinks roughly with sqrt(total samples).
        """
        p = max(int(parts), 1)
        return StopRule(
            min_samples=max(3, math.ceil(self.min_samples / p)),
            min_time_s=self.min_time_s / p,
            target_rel_ci=self.target_rel_ci * math.sqrt(p),
            max_time_s=self.max_time_s / p,
            max_samples=max(3, math.ceil(self.max_samples / p)),
        )


def bootstrap_ci(
    values: Sequence[float],
    stat: Callable = np.median,
    n_boot: int = 2000,
    conf: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile-bootstrap CI of stat(values); seeded, vectorized, chunked to bound memory."""
    x = np.asarray(values, dtype=float)
    n = x.size
    if n == 0:
        raise ValueError("bootstrap_ci needs at least one value")
    rng = np.random.default_rng(seed)
    # Keep each resample matrix under ~4M floats (32 MB) whatever n is.
    chunk = max(1, min(n_boot, 4_000_000 // n))
    out = []
    for start in range(0, n_boot, chunk):
        m = min(chunk, n_boot - start)
        res = x[rng.integers(0, n, size=(m, n))]
        try:
            out.append(np.asarray(stat(res, axis=1), dtype=float))
        except TypeError:                          # a stat without an axis argument
            out.append(np.array([stat(row) for row in res], dtype=float))
    boots = np.concatenate(out)
    return _percentile_ci(boots, conf)


def _percentile_ci(boots: np.ndarray, conf: float) -> tuple[float, float]:
    """The central `conf` interval of bootstrap replicates."""
    alpha = 1.0 - conf
    lo, hi = np.percentile(boots, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return float(lo), float(hi)


@dataclass
class PairedSpeedup:
    """Per-round ratios median(b)/median(a), their median (the speedup of a over b) and its CI."""

    ratios: list[float]
    speedup: float
    ci: tuple[float, float]


def paired_speedup(
    a_rounds: Sequence[Sequence[float]], b_rounds: Sequence[Sequence[float]], seed: int = 0
) -> PairedSpeedup:
    """Speedup of a (candidate) over b (baseline) from interleaved rounds: median of per-round ratios,
    with the two-level bootstrap CI of `paired_bootstrap_ci`."""
    if len(a_rounds) != len(b_rounds) or not a_rounds:
        raise ValueError("paired_speedup needs the same, non-zero number of rounds for a and b")
    if not all(len(r) for r in (*a_rounds, *b_rounds)):
        raise ValueError("paired_speedup needs samples in every round of a and b")
    ratios = [float(np.median(b)) / float(np.median(a)) for a, b in zip(a_rounds, b_rounds)]
    return PairedSpeedup(ratios, float(np.median(ratios)), paired_bootstrap_ci(a_rounds, b_rounds, seed=seed))


def paired_bootstrap_ci(
    a_rounds: Sequence[Sequence[float]],
    b_rounds: Sequence[Sequence[float]],
    n_boot: int = 2000,
    conf: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Two-level (cluster) bootstrap CI of the median per-round ratio median(b) / median(a).

    Each replicate draws the rounds with replacement and, inside each drawn round, the samples of a
    and of b with replacement. Resampling the six-odd ratios alone treats each as exact and gives an
    interval too narrow to trust when the per-round medians are themselves noisy (an A/A pair then
    "excludes 1" more often than 5% of the time); the inner level carries that noise into the CI.
    """
    if len(a_rounds) != len(b_rounds) or not a_rounds:
        raise ValueError("paired_bootstrap_ci needs the same, non-zero number of rounds for a and b")
    rng = np.random.default_rng(seed)
    ratio = np.column_stack([_boot_medians(b, n_boot, rng) / _boot_medians(a, n_boot, rng)
                             for a, b in zip(a_rounds, b_rounds)])          # (n_boot, rounds)
    pick = rng.integers(0, ratio.shape[1], size=ratio.shape)
    boots = np.median(np.take_along_axis(ratio, pick, axis=1), axis=1)
    return _percentile_ci(boots, conf)


def _boot_medians(values: Sequence[float], n_boot: int, rng) -> np.ndarray:
    """n_boot draws of the median of a resample (with replacement) of values, without building the
    resamples: the k-th smallest of n resampled values is sorted[floor(n * U_(k))], with U_(k) the k-th
    order statistic of n uniforms, a Beta(k, n + 1 - k) draw; for even n the next one is
    U_(k) + (1 - U_(k)) * Beta(1, n - k). Exact, and O(n_boot) instead of O(n_boot * n)."""
    xs = np.sort(np.asarray(values, dtype=float))
    n = xs.size
    if n == 0:
        raise ValueError("a round without samples")
    if n == 1:
        return np.full(n_boot, xs[0])
    k = (n + 1) // 2
    u = rng.beta(k, n + 1 - k, size=n_boot)
    lower = xs[np.minimum((u * n).astype(np.int64), n - 1)]
    if n % 2:
        return lower
    u2 = u + (1.0 - u) * rng.beta(1, n - k, size=n_boot)
    return 0.5 * (lower + xs[np.minimum((u2 * n).astype(np.int64), n - 1)])


def geomean(values) -> Optional[float]:
    """Geometric mean of the positive values (None when there are none)."""
    v = [float(x) for x in values if x and x > 0]
    return math.exp(sum(math.log(x) for x in v) / len(v)) if v else None


def min_effect(aa_spread: Optional[float]) -> float:
    """The smallest relative effect called an improvement: max(1%, 3 x the A/A spread)."""
    return max(MIN_EFFECT, 3.0 * (abs(aa_spread) if aa_spread is not None else 0.0))


def is_improvement(speedup: float, ci: tuple[float, float], aa_spread: Optional[float]) -> bool:
    """An improvement only when the CI excludes 1 and the effect >= max(1%, 3 x the A/A spread)."""
    return ci[0] > 1.0 and speedup - 1.0 >= min_effect(aa_spread)
