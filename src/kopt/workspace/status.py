"""Where the loop stands: iterations and their outcomes, the best candidate, stagnation.

An iteration is one `kopt commit`; its trajectory snapshot records the candidate id and the
geomeans of that candidate's latest verdict (see kopt.workspace.vcs.SnapshotMeta). The candidate's latest
verdict in the ledger on the snapshot's device wins over the snapshot's copy, so re-verifying a
candidate (a newer harness, the ragged cases) re-judges its iteration.

Improvement rule (simple on purpose), with threshold = max(0.01, 3 * aa_spread): a verdict has two
geomeans, over the uniform cases (G) and over the ragged ones (R); iteration i improves when it did
not fail and, against the best (the last improving iteration before i),
    G >= G_best * (1 + threshold) and R >= R_best * (1 - threshold)     (uniform up, ragged not lost)
 or R >= R_best * (1 + threshold) and G >= G_best * (1 - threshold)     (ragged up, uniform not lost).
When either verdict has no ragged geomean (rows older than the ragged cases, or a verdict without
them) the uniform rule alone decides, G >= G_best * (1 + threshold), and the reason says so. The
first iteration with a correct verdict on a device improves by definition. aa_spread is the `spread`
of results/calibration-<device>.json (`kopt calibrate`; device of the latest verdict row), else
kopt.eval.calibrate.DEFAULT_SPREAD (0.01, so +3% without a calibration). An iteration fails when its
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
    geomean_ragged: Optional[float] = None
    """Geomean speedup over the ragged cases (None: none in the verdict)."""
    n_ragged: int = 0
    pct_limit: Optional[float] = None
    """Geomean PCT_LIMIT over the uniform cases, and over the ragged ones below."""
    pct_limit_ragged: Optional[float] = None
    best_ragged_before: Optional[float] = None
    reason: str = ""
    """Why the rule gave this outcome: both geomeans against the best, or why one was left out."""


@dataclass
class Judgement:
    """The improvement rule's answer and its reason."""

    outcome: str
    reason: str


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
    """The shown candidate and the rule's best beside it (kopt.report.shown.Shown.brief())."""

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return asdict(self)


def threshold(ws: Path, device: Optional[str] = None, rows: Optional[list[dict]] = None) -> float:
    """Relative improvement an iteration must beat: max(1%, 3 x A/A spread of the verdict's device).
    rows: the ledger's rows when already read."""
    from kopt.eval.calibrate import DEFAULT_SPREAD, aa_spread
    from kopt.timing.stats import min_effect

    if device is None:  # the device of the latest verdict row
        verdicts = [r for r in (rows if rows is not None else _rows(ws)) if r.get("mode") == "verdict"]
        device = verdicts[-1].get("device") if verdicts else None
    return min_effect(aa_spread(device, Path(ws)) if device else DEFAULT_SPREAD)


def outcome(geomean: Optional[float], failed: bool, best: Optional[float], thr: float) -> str:
    """The uniform rule alone: failed (no correct verdict), improved (first, or >= best x (1 + thr)),
    else not improved (`judge` is the whole rule)."""
    return judge(geomean, None, failed, best, None, thr).outcome


def judge(geomean: Optional[float], ragged: Optional[float], failed: bool, best: Optional[float],
          best_ragged: Optional[float], thr: float) -> Judgement:
    """The improvement rule on both geomeans (module docstring), with the reason in words."""
    if failed or geomean is None:
        return Judgement("failed", "no correct verdict" if failed else "no uniform case timed")
    if best is None:
        return Judgement("improved", "the first correct verdict on this device")
    du = geomean / best - 1
    up = f"+{thr * 100:.1f}%"
    if ragged is None or best_ragged is None:
        which = ("neither verdict has a ragged geomean" if ragged is None and best_ragged is None else
                 "this verdict has no ragged geomean" if ragged is None else
                 "the previous best has no ragged geomean (older rows)")
        got = "improved" if du >= thr else "not improved"
        return Judgement(got, f"uniform {du * 100:+.1f}%; {which}: judged by the uniform geomean alone")
    dr = ragged / best_ragged - 1
    both = f"uniform {du * 100:+.1f}%, ragged {dr * 100:+.1f}%"
    if (du >= thr and dr >= -thr) or (dr >= thr and du >= -thr):
        gained = "both gain" if min(du, dr) >= thr else ("uniform gains" if du >= thr else "ragged gains")
        return Judgement("improved", f"{both}: {gained} {up} or more, neither loses beyond the noise")
    if du >= thr or dr >= thr:
        lost = "ragged" if du >= thr else "uniform"
        return Judgement("not improved", f"{both}: the {lost} geomean loses more than the -{thr * 100:.1f}% "
                                         "noise band")
    return Judgement("not improved", f"{both}: neither gains {up}")


def current_candidate(ws: Path) -> Optional[str]:
    """candidate_id of the workspace's solution/tilelang/run_kernel.py (None when absent)."""
    from kopt.paths import default_candidate
    from kopt.workspace.vcs import candidate_hash

    return candidate_hash(default_candidate(ws))[1]


def _rows(ws: Path) -> list[dict]:
    from kopt.workspace.ledger import load_dicts
    from kopt.paths import ledger_file

    return load_dicts(ledger_file(ws)).rows


def history(ws: Path, rows: Optional[list[dict]] = None) -> list[Iteration]:
    """Every committed iteration with its outcome under the improvement rule.

    Geomeans are compared per device: an iteration verified on an H200 is judged against the best
    earlier H200 iteration, never against a CPU one; the first verdict on a device is an improvement
    (the device's first best)."""
    from kopt.workspace import ranking
    from kopt.workspace.vcs import snapshots

    best: dict = {}
    thr: dict = {}
    out = []
    verdicts = None
    for path, m in snapshots(ws):
        g = ranking.Geomeans(m.geomean, m.n_cases, m.geomean_ragged, m.n_ragged, m.pct_limit, m.pct_limit_ragged)
        failed, dev = m.failed, m.device
        if m.candidate_id:  # the candidate's latest verdict in the ledger (on the snapshot's device) wins
            if verdicts is None:
                verdicts = [r for r in (_rows(ws) if rows is None else rows) if r.get("mode") == "verdict"]
            late = ranking.latest_verdict(verdicts, m.candidate_id, dev if m.verdict_rows else None)
            if late:
                g, failed, dev = ranking.geomeans(late), ranking.failed(late), ranking.verdict_device(late)
            elif m.verdict_rows == 0:
                failed = True
        if dev not in thr:
            thr[dev] = threshold(ws, dev, rows)
        prev, prev_r = best.get(dev, (None, None))
        j = judge(g.uniform, g.ragged, failed, prev, prev_r, thr[dev])
        out.append(Iteration(m.iteration, m.label, m.candidate_id, g.uniform, g.n_uniform, j.outcome, prev,
                             path.name, dev, g.ragged, g.n_ragged, g.pct_limit, g.pct_limit_ragged, prev_r, j.reason))
        if j.outcome == "improved":
            best[dev] = (g.uniform, g.ragged)
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
    from kopt.workspace.ranking import row_speedup

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
    from kopt.workspace import ledger
    from kopt.paths import ledger_file
    from kopt.records import CaseResult

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


def _gm(v: Optional[float]) -> str:
    return "NA" if v is None else f"{v:.3f}x"


def why_best(best: Optional[Iteration], top: Optional[dict], hist: list[Iteration]) -> str:
    """The best candidate in words: the best iteration by the rule (both geomeans and the rule's reason),
    and the ledger's top-ranked candidate when it is another one (with why the rule did not keep it)."""
    parts = []
    if best is not None:
        parts.append(f"iteration {best.iteration} (`{best.candidate_id}`) is the best by the improvement rule: "
                     f"uniform {_gm(best.geomean)}, ragged {_gm(best.geomean_ragged)} ({best.reason})")
    if top is not None and (best is None or top.get("candidate_id") != best.candidate_id):
        text = (f"the ledger ranks `{top['candidate_id']}` first by uniform geomean ({_gm(top.get('geomean'))}, "
                f"ragged {_gm(top.get('geomean_ragged'))}, {top.get('basis')} rows)")
        mine = [it for it in hist if it.candidate_id == top.get("candidate_id")]
        if mine:
            text += f": iteration {mine[-1].iteration} {mine[-1].outcome} ({mine[-1].reason})"
        elif best is not None:
            text += ": not a committed iteration"
        parts.append(text)
    return "; ".join(parts)


def status(ws: Path, last: int = 5, record: bool = True, device: Optional[str] = None) -> StatusReport:
    """Iterations, best per case and overall, recent outcomes, stagnation (recorded in the ledger)."""
    from kopt.workspace import ranking
    from kopt.workspace.ledger import load_dicts
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
    rep.why_best = why_best(rep.best, top, hist)
    from kopt.report.shown import shown_candidate

    rep.shown = shown_candidate(ws, rows, device).brief()
    if stagnating:
        rep.worst_case = _worst_case(ranking.latest_verdict(rows, hist[-1].candidate_id))
        if rep.worst_case is None and rep.best is not None:  # the last iteration has no verdict
            rep.worst_case = _worst_case(ranking.latest_verdict(rows, rep.best.candidate_id))
        rep.protocol = protocol(rep.worst_case)
        rep.recorded = record and record_stagnation(ws, hist, rep.worst_case, rows)
    return rep
