"""The device's noise floor: the A/A spread of SPEEDUP that `kopt calibrate` (kopt.eval.calibrate) stores in
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
