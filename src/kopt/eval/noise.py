"""A row's NOISY flag: whether its SPEEDUP is to be trusted to a few percent (the device's A/A spread, the
noise floor the improvement rule reads, is stored by kopt.store.calibration)."""

from __future__ import annotations

from typing import Optional

#: A SPEEDUP whose 95% CI is wider than this (relative half-width) is flagged noisy.
NOISY_CI = 0.05
#: Slack around the CI before the ratio of medians is said to disagree with it (the smallest effect ever called
#: an improvement: closer than that, the two figures say the same thing).
AGREE_SLACK = 0.01


def row_noisy(speedup: Optional[float], ci: Optional[tuple[float, float]], runtime_ms: Optional[float],
              ref_runtime_ms: Optional[float], fallback: Optional[bool] = None) -> Optional[bool]:
    """A row's NOISY: its SPEEDUP is not to be trusted to a few percent. True when the CI of the median per-round
    ratio is wider than +-NOISY_CI, or when the ratio of the pooled medians (REF_RUNTIME / RUNTIME) lies outside
    that CI (widened by AGREE_SLACK): the rounds disagree with the whole run, as when the load on the host
    changed between them. Without a paired speedup: `fallback` (the candidate timing's own flag)."""
    if speedup is None or ci is None or not runtime_ms or not ref_runtime_ms or speedup <= 0:
        return fallback
    lo, hi = ci
    ratio = ref_runtime_ms / runtime_ms
    wide = (hi - lo) / 2 / speedup > NOISY_CI
    return wide or not lo * (1 - AGREE_SLACK) <= ratio <= hi * (1 + AGREE_SLACK)
