"""Where the loop stands: iterations and their outcomes, the best candidate, stagnation.

An iteration is one `kopt commit`; its trajectory snapshot records the candidate id and the
geomean speedup of that candidate's latest verdict (see kopt.vcs.SnapshotMeta).

Improvement rule (simple on purpose): iteration i improves when it did not fail and
    geomean_i >= best_geomean * (1 + threshold),   threshold = max(0.01, 3 * aa_spread)
where best_geomean is the geomean of the last improving iteration before i (the first iteration
with a correct verdict improves by definition) and aa_spread is the `spread` of
results/calibration-<device>.json (`kopt calibrate`; device of the latest verdict row), else
kopt.calibrate.DEFAULT_SPREAD (0.01, so +3% without a calibration). An iteration fails when its
candidate has no verdict or any verdict row is incorrect or not ok.

Stagnation: STAGNATION_AFTER consecutive non-improving iterations. `status` then prints the
protocol and records one ledger row with kind="stagnation" per episode (an episode is keyed by
the last improving iteration, so it is recorded once until the next improvement).
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

STAGNATION_AFTER = 3


@dataclass
class Iteration:
    """One committed iteration and its outcome."""

    iteration: int
    label: str
    candidate_id: Optional[str]
    geomean: Optional[float]
    n_cases: int
    outcome: str
    """improved | not improved | failed"""
    best_before: Optional[float] = None
    snapshot: str = ""
    device: Optional[str] = None
    """Device of the iteration's verdict; outcomes compare only iterations on one device."""


@dataclass
class StatusReport:
    """What `kopt status` shows."""

    iterations: int
    threshold: float
    best: Optional[Iteration]
    best_candidate: Optional[dict]
    best_per_case: list[dict]
    recent: list[Iteration]
    since_improvement: int
    stagnating: bool
    worst_case: Optional[int] = None
    protocol: list[str] = field(default_factory=list)
    recorded: bool = False
    shown: Optional[dict] = None
    """The shown candidate and the rule's best beside it (kopt.shown.Shown.brief())."""

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return asdict(self)


def threshold(ws: Path, device: Optional[str] = None, rows: Optional[list[dict]] = None) -> float:
    """Relative improvement an iteration must beat: max(1%, 3 x A/A spread of the verdict's device).
    rows: the ledger's rows when already read."""
    from kopt.calibrate import DEFAULT_SPREAD, aa_spread
    from kopt.stats import min_effect

    if device is None:  # the device of the latest verdict row
        verdicts = [r for r in (rows if rows is not None else _rows(ws)) if r.get("mode") == "verdict"]
        device = verdicts[-1].get("device") if verdicts else None
    return min_effect(aa_spread(device, Path(ws)) if device else DEFAULT_SPREAD)


def outcome(geomean: Optional[float], failed: bool, best: Optional[float], thr: float) -> str:
    """The improvement rule: failed (no correct verdict), improved (first, or >= best x (1 + thr)),
    else not improved."""
    if failed or geomean is None:
        return "failed"
    return "improved" if best is None or geomean >= best * (1 + thr) else "not improved"


def current_candidate(ws: Path) -> Optional[str]:
    """candidate_id of the workspace's solution/tilelang/run_kernel.py (None when absent)."""
    from kopt.paths import default_candidate
    from kopt.vcs import candidate_hash

    return candidate_hash(default_candidate(ws))[1]


def _rows(ws: Path) -> list[dict]:
    from kopt.ledger import load_dicts
    from kopt.paths import ledger_file

    return load_dicts(ledger_file(ws)).rows


def history(ws: Path, rows: Optional[list[dict]] = None) -> list[Iteration]:
    """Every committed iteration with its outcome under the improvement rule.

    Geomeans are compared per device: an iteration verified on an H200 is judged against the best
    earlier H200 iteration, never against a CPU one; the first verdict on a device is an improvement
    (the device's first best)."""
    from kopt import ranking
    from kopt.vcs import snapshots

    best: dict = {}
    thr: dict = {}
    out = []
    for path, m in snapshots(ws):
        gm, n, failed, dev = m.geomean, m.n_cases, m.failed, m.device
        if (m.verdict_rows == 0 or dev is None) and m.candidate_id:  # verdict after the commit, or an old meta
            rows = _rows(ws) if rows is None else rows
            late = ranking.latest_verdict(rows, m.candidate_id)
            if m.verdict_rows == 0:
                (gm, n), failed = ranking.geomean_of(late), ranking.failed(late)
            dev = ranking.verdict_device(late)
        if dev not in thr:
            thr[dev] = threshold(ws, dev, rows)
        prev = best.get(dev)
        got = outcome(gm, failed, prev, thr[dev])
        out.append(Iteration(m.iteration, m.label, m.candidate_id, gm, n, got, prev, path.name, dev))
        if got == "improved":
            best[dev] = gm
    return out


def best_iteration(hist: list[Iteration], device: Optional[str] = None) -> Optional[Iteration]:
    """The last improving iteration (by the rule, the best so far), or None; with `device`, the
    last improving iteration on that device."""
    return next((it for it in reversed(hist) if it.outcome == "improved"
                 and (device is None or it.device == device)), None)


def since_improvement(hist: list[Iteration]) -> int:
    """Iterations after the last improving one (all of them when none improved)."""
    best = best_iteration(hist)
    return sum(1 for it in hist if best is None or it.iteration > best.iteration)


def protocol(worst_case: Optional[int]) -> list[str]:
    """The stagnation protocol, worst case filled in."""
    case = worst_case if worst_case is not None else "N"
    return [f"re-profile the worst case: kopt profile --case {case}",
            "walk knowledge/profiling/diagnosis_checklist.md and name the limiting dimension",
            "search for the best-known technique for that dimension before the next edit"]


def _worst_case(rows: list[dict]) -> Optional[int]:
    """The failing case, else the case with the lowest speedup, of a set of verdict rows."""
    from kopt.ranking import row_speedup

    if not rows:
        return None
    bad = [r for r in rows if r.get("correct") is not True]
    if bad:
        return bad[0].get("case")
    return min(rows, key=lambda r: row_speedup(r) or float("inf")).get("case")


def record_stagnation(ws: Path, hist: list[Iteration], worst: Optional[int],
                      rows: Optional[list[dict]] = None) -> bool:
    """Append one kind="stagnation" ledger row for the current episode unless it is there; True if written.
    rows: the ledger's rows when already read."""
    from kopt import ledger
    from kopt.paths import ledger_file
    from kopt.results import CaseResult

    best = best_iteration(hist)
    episode = f"after-iter-{best.iteration if best else 0}"
    path = ledger_file(ws)
    for r in rows if rows is not None else ledger.load_dicts(path).rows:
        if r.get("kind") == "stagnation" and (r.get("config") or {}).get("episode") == episode:
            return False
    since = since_improvement(hist)
    last = hist[-1]
    row = CaseResult(
        row_id=uuid.uuid4().hex, kind="stagnation", mode="signal", candidate_id=last.candidate_id or "",
        case=worst or 0, status="ok", message=f"{since} iterations without improvement since "
        f"{'iter ' + str(best.iteration) if best else 'the start'}: re-profile protocol",
        config={"episode": episode, "since_improvement": since, "iterations": [it.iteration for it in hist[-since:]],
                "best_iteration": best.iteration if best else None, "best_geomean": best.geomean if best else None})
    ledger.append(path, [row])
    return True


def status(ws: Path, last: int = 5, record: bool = True, device: Optional[str] = None) -> StatusReport:
    """Iterations, best per case and overall, recent outcomes, stagnation (recorded in the ledger)."""
    from kopt import ranking
    from kopt.ledger import load_dicts
    from kopt.paths import ledger_file

    ws = Path(ws)
    loaded = load_dicts(ledger_file(ws))  # read once: nothing below writes before the stagnation row
    rows = loaded.rows
    hist = history(ws, rows)
    df, _ = ranking.load_frame(ledger_file(ws), device, loaded)
    top = ranking.best(df)
    since = since_improvement(hist)
    stagnating = len(hist) >= STAGNATION_AFTER and since >= STAGNATION_AFTER
    rep = StatusReport(len(hist), threshold(ws, rows=rows), best_iteration(hist), top,
                       ranking.records(ranking.best_per_case(df)), hist[-last:] if last > 0 else [], since, stagnating)
    from kopt.shown import shown_candidate

    rep.shown = shown_candidate(ws, rows, device).brief()
    if stagnating:
        rep.worst_case = _worst_case(ranking.latest_verdict(rows, hist[-1].candidate_id))
        if rep.worst_case is None and rep.best is not None:  # the last iteration has no verdict
            rep.worst_case = _worst_case(ranking.latest_verdict(rows, rep.best.candidate_id))
        rep.protocol = protocol(rep.worst_case)
        rep.recorded = record and record_stagnation(ws, hist, rep.worst_case, rows)
    return rep
