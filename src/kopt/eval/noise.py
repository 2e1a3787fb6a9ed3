"""The device's noise floor: the A/A spread of SPEEDUP that `kopt calibrate` stores in
results/calibration-<device>.json, read by the improvement rule (bench rows, kopt status, kopt tune)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from pydantic import BaseModel, Field

#: Spread assumed when a device has no calibration yet (1%: the rule's own minimum effect).
DEFAULT_SPREAD = 0.01


class AAEntry(BaseModel):
    """One A/A measurement: a function timed against itself on one case."""

    case: int
    pair: str                      # aa_base | aa_cand
    speedup: Optional[float] = None
    ci: Optional[tuple[float, float]] = None
    spread: Optional[float] = Field(default=None, ge=0)
    """max(|speedup - 1|, CI half-width): how far an A/A ratio wanders from 1."""


class Calibration(BaseModel):
    """The noise floor of one device."""

    schema_version: int = 1
    device: str
    timestamp: str
    commit: Optional[str] = None
    ref: str = "NA"
    entries: list[AAEntry]
    spread: float = Field(ge=0)
    """The largest entry spread: 3 x this is the smallest effect called an improvement."""


def calibration_file(device: str, root: Path | None = None) -> Path:
    """results/calibration-<device>.json in the workspace."""
    from kopt.paths import workspace

    return (root or workspace()) / "results" / f"calibration-{device}.json"


def aa_spread(device: str, root: Path | None = None) -> float:
    """The stored A/A spread of a device, or DEFAULT_SPREAD when it was never calibrated."""
    f = calibration_file(device, root)
    try:
        return Calibration.model_validate_json(f.read_text()).spread
    except (OSError, ValueError):
        return DEFAULT_SPREAD


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
