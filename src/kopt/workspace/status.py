"""`kopt status`: where the loop stands: the iterations and their outcomes (kopt.policy.iterations), the best
candidate and why, the shown candidate, stagnation.

Stagnation: STAGNATION_AFTER consecutive non-improving iterations. `status` then prints the
protocol and records one ledger row with kind="stagnation" per episode (an episode is keyed by
the last improving iteration, so it is recorded once until the next improvement).
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from kopt.policy.iterations import (
    Iteration,
    best_iteration,
    history,
    judged_since,
    since_improvement,
    threshold,
    trajectory,
)
from kopt.records import SPEEDUP_FMT, fmt_na

STAGNATION_AFTER = 3


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
    why_best: str = ""
    """Which candidate is best and why, in words: the rule's reason for the best iteration, both geomeans."""
    shown: Optional[dict] = None
    """The shown candidate and the rule's best beside it (kopt.policy.shown.Shown.brief())."""

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return asdict(self)


def protocol(worst_case: Optional[int]) -> list[str]:
    """The stagnation protocol, worst case filled in."""
    case = worst_case if worst_case is not None else "N"
    return [f"re-profile the worst case: kopt profile --case {case}",
            "walk knowledge/profiling/diagnosis_checklist.md and name the limiting dimension",
            "search for the best-known technique for that dimension before the next edit"]


def _worst_case(rows: list[dict]) -> Optional[int]:
    """The failing case, else the case with the lowest speedup, of a set of verdict rows."""
    from kopt.policy.ranking import row_speedup

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
    from kopt.paths import ledger_file
    from kopt.records import CaseResult
    from kopt.store import ledger

    best = best_iteration(hist)
    episode = f"after-iter-{best.iteration if best else 0}"
    path = ledger_file(ws)
    for r in rows if rows is not None else ledger.load_dicts(path).rows:
        if r.get("kind") == "stagnation" and (r.get("config") or {}).get("episode") == episode:
            return False
    since = since_improvement(hist)
    last = hist[-1]
    counted = [it.iteration for it in judged_since(hist)]
    row = CaseResult(
        row_id=uuid.uuid4().hex, kind="stagnation", mode="signal", candidate_id=last.candidate_id or "",
        case=worst or 0, status="ok", message=f"{since} iterations without improvement since "
        f"{'iter ' + str(best.iteration) if best else 'the start'}: re-profile protocol",
        config={"episode": episode, "since_improvement": since, "iterations": counted,
                "best_iteration": best.iteration if best else None, "best_geomean": best.geomean if best else None})
    ledger.append(path, [row])
    return True


def why_best(best: Optional[Iteration], top: Optional[dict], hist: list[Iteration]) -> str:
    """The best candidate in words: the best iteration by the rule (both geomeans and the rule's reason),
    and the ledger's top-ranked candidate when it is another one (with why the rule did not keep it)."""
    parts = []
    if best is not None:
        parts.append(f"iteration {best.iteration} (`{best.candidate_id}`) is the best by the improvement rule: "
                     f"uniform {fmt_na(best.geomean, SPEEDUP_FMT)}, ragged {fmt_na(best.geomean_ragged, SPEEDUP_FMT)} "
                     f"({best.reason})")
    if top is not None and (best is None or top.get("candidate_id") != best.candidate_id):
        text = (f"the ledger ranks `{top['candidate_id']}` first by uniform geomean "
                f"({fmt_na(top.get('geomean'), SPEEDUP_FMT)}, ragged {fmt_na(top.get('geomean_ragged'), SPEEDUP_FMT)}, "
                f"{top.get('basis')} rows)")
        mine = [it for it in hist if it.candidate_id == top.get("candidate_id")]
        if mine:
            text += f": iteration {mine[-1].iteration} {mine[-1].outcome} ({mine[-1].reason})"
        elif best is not None:
            text += ": not a committed iteration"
        parts.append(text)
    return "; ".join(parts)


def status(ws: Path, last: int = 5, record: bool = True, device: Optional[str] = None) -> StatusReport:
    """Iterations, best per case and overall, recent outcomes, stagnation (recorded in the ledger)."""
    from kopt.paths import ledger_file
    from kopt.policy import ranking
    from kopt.store import load_dicts

    ws = Path(ws)
    loaded = load_dicts(ledger_file(ws))  # read once: nothing below writes before the stagnation row
    rows = loaded.rows
    from kopt.policy import check_device

    device = check_device(rows, device)  # before anything is written
    hist = history(ws, rows)
    df, _ = ranking.load_frame(ledger_file(ws), device, loaded)
    top = ranking.best(df)
    since = since_improvement(hist)
    stagnating = len(hist) >= STAGNATION_AFTER and since >= STAGNATION_AFTER
    rep = StatusReport(len(hist), threshold(ws, rows=rows), best_iteration(hist), top,
                       ranking.records(ranking.best_per_case(df)), hist[-last:] if last > 0 else [], since, stagnating)
    rep.why_best = why_best(rep.best, top, hist)
    from kopt.policy import shown_candidate

    points = None if device else trajectory(ws, rows, hist=hist)[0]  # the history above, not computed again
    # without --device the shown line ranks over the shipped candidate's device (shown.ranking_device), which
    # shown_candidate finds itself: `top` above is over every row
    rep.shown = shown_candidate(ws, rows, device, points=points, top=top if device else None).brief()
    if stagnating:
        rep.worst_case = _worst_case(ranking.latest_verdict(rows, hist[-1].candidate_id))
        if rep.worst_case is None and rep.best is not None:  # the last iteration has no verdict
            rep.worst_case = _worst_case(ranking.latest_verdict(rows, rep.best.candidate_id))
        rep.protocol = protocol(rep.worst_case)
        rep.recorded = record and record_stagnation(ws, hist, rep.worst_case, rows)
    return rep
