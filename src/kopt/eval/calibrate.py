"""A/A calibration: the noise floor of SPEEDUP per device, stored in results/ and used by the improvement rule."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, Field

from kopt.cases import Case

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


def _entry(case: int, pair: str, r) -> AAEntry:
    if r.speedup is None or r.speedup_ci is None:
        return AAEntry(case=case, pair=pair)
    half = (r.speedup_ci[1] - r.speedup_ci[0]) / 2
    return AAEntry(case=case, pair=pair, speedup=r.speedup, ci=r.speedup_ci,
                   spread=max(abs(r.speedup - 1.0), half))


def run(path: Path, cases: list[Case], opts) -> Calibration:
    """A/A runs of the baseline and of the candidate on each case; stores and returns the calibration."""
    from dataclasses import replace

    from kopt.eval.bench import evaluate

    entries, device, ref, commit = [], "NA", "NA", None
    for pair in ("aa_base", "aa_cand"):
        o = replace(opts, pair=pair, mode="calibrate")
        for r in evaluate(path, cases, o):
            entries.append(_entry(r.case, pair, r))
            device, ref, commit = r.device, r.ref, r.commit
    spreads = [e.spread for e in entries if e.spread is not None]
    cal = Calibration(device=device, timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                      commit=commit, ref=ref, entries=entries, spread=max(spreads) if spreads else DEFAULT_SPREAD)
    from kopt import atomic

    atomic.write_text(calibration_file(device), json.dumps(cal.model_dump(mode="json"), indent=2) + "\n")
    return cal
