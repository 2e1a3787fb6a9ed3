"""`kopt calibrate`: A/A runs (the baseline and the candidate each timed against itself) that measure the
device's noise floor and store it (kopt.store.calibration)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from kopt.cases import Case
from kopt.store.calibration import DEFAULT_SPREAD, AAEntry, Calibration, calibration_file


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
