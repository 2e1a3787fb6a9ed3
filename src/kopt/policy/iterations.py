"""The loop's iterations and the improvement rule that judges them.

An iteration is one `kopt commit`; its trajectory snapshot records the candidate id and the
geomeans of that candidate's latest verdict (see kopt.store.trajectory.SnapshotMeta). The candidate's latest
verdict in the ledger on the snapshot's device wins over the snapshot's copy, so re-verifying a
candidate (a newer harness, the ragged cases) re-judges its iteration.

Improvement rule (simple on purpose), with threshold = max(0.01, 3 * aa_spread): a verdict has two
geomeans, over the uniform cases (G) and over the ragged ones (R); iteration i improves when it did
not fail and, against the best (the last improving iteration before i),
    G >= G_best * (1 + threshold) and R >= R_best * (1 - threshold)     (uniform up, ragged not lost)
 or R >= R_best * (1 + threshold) and G >= G_best * (1 - threshold)     (ragged up, uniform not lost).
The best's side of that comparison is its latest verdict, unless its candidate was verified beside the
iteration's: a finished verdict of the best's candidate on the same device, timed the same way, within
PAIR_WINDOW_S of the iteration's (the two ends of one `verifyat verify` campaign call) is compared instead,
the closest in time, and the reason names that run. Verdicts of different sessions differ by about 1% on
the same code (H200, iteration 31), so a pair timed together settles a gain the threshold leaves open.
A rule on the named cases alone can be won by fitting them, and missed by a gain on shapes they lack, so a verdict
also times held-out draws from the workload library and the reigning candidate on the same draws (rows of mode
heldout, paired_run = the verdict's run), and weigh_heldout reads the ratio of the two (kopt.policy.ranking.
heldout_ratio): an iteration the rule above calls improved whose held-out SPEEDUPs lose to the reigning
candidate's beyond the threshold (ratio < 1 - threshold) is `overfit`, not improved, and does not become the best;
one it calls not improved because neither named geomean gains, while neither loses beyond the threshold, is
improved when its held-out SPEEDUPs beat the reigning candidate's by the threshold (ratio >= 1 + threshold): the
deployed shapes gain and the named cases hold. When either verdict has no ragged geomean (rows older than the
ragged cases, or a verdict without them) the uniform rule alone decides, G >= G_best * (1 + threshold),
and the reason says so. The first iteration with a correct verdict on a device improves by definition, and
so does the first one timed device-only there: verdicts timed device-only are judged only against each other
(timing_generation). aa_spread is the `spread`
of results/calibration-<device>.json (`kopt calibrate`; device of the latest verdict row), else
kopt.store.calibration.DEFAULT_SPREAD (0.01, so +3% without a calibration). An iteration fails when any row of its
candidate's verdict is incorrect or not ok; one whose candidate has no verdict (bench rows, a quick verdict's
screen rows) is `not judged`: no outcome, and it does not count toward stagnation.

The trajectory (`trajectory`) is what the plots and the report draw: the git iterations when there are
any, else verdict rows grouped by candidate in timestamp order, judged by the same rule.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from kopt.policy import ranking


@dataclass
class Iteration:
    """One committed iteration and its outcome."""

    iteration: int
    label: str
    candidate_id: Optional[str]
    geomean: Optional[float]
    n_cases: int
    outcome: str
    """improved | not improved | overfit | failed | not judged (no verdict of its candidate)"""
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
    generation: str = "eager"
    """How its verdict was timed (timing_generation): only iterations of one generation are compared."""


@dataclass
class Judgement:
    """The improvement rule's answer and its reason."""

    outcome: str
    reason: str
    #: neither named geomean lost beyond the threshold (weigh_heldout may then count a held-out gain)
    named_held: bool = False


def threshold(ws: Path, device: Optional[str] = None, rows: Optional[list[dict]] = None) -> float:
    """Relative improvement an iteration must beat: max(1%, 3 x A/A spread of the verdict's device).
    rows: the ledger's rows when already read."""
    from kopt.store.calibration import DEFAULT_SPREAD, aa_spread
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
        return Judgement(got, f"uniform {du * 100:+.1f}%; {which}: judged by the uniform geomean alone",
                         du >= -thr)
    dr = ragged / best_ragged - 1
    both = f"uniform {du * 100:+.1f}%, ragged {dr * 100:+.1f}%"
    if (du >= thr and dr >= -thr) or (dr >= thr and du >= -thr):
        gained = "both gain" if min(du, dr) >= thr else ("uniform gains" if du >= thr else "ragged gains")
        return Judgement("improved", f"{both}: {gained} {up} or more, neither loses beyond the noise", True)
    if du >= thr or dr >= thr:
        lost = "ragged" if du >= thr else "uniform"
        return Judgement("not improved", f"{both}: the {lost} geomean loses more than the -{thr * 100:.1f}% "
                                         "noise band")
    return Judgement("not improved", f"{both}: neither gains {up}", du >= -thr and dr >= -thr)


#: Two verdicts at most this far apart (seconds) count as timed together, on one machine (a device lease is
#: held at most 30 minutes): the improvement rule then compares the pair (module docstring).
PAIR_WINDOW_S = 1800


def run_time(rows: list[dict]) -> Optional[datetime]:
    """When a verify run ended: its latest row's timestamp (None when no row has a readable one)."""
    times = []
    for r in rows:
        try:
            t = datetime.fromisoformat(str(r.get("timestamp")))
        except ValueError:
            continue
        times.append(t if t.tzinfo else t.replace(tzinfo=timezone.utc))
    return max(times) if times else None


@dataclass
class Pair:
    """The best's verdict timed beside an iteration's (paired_verdict)."""

    run_id: str
    apart_s: float
    geomeans: ranking.Geomeans

    def note(self) -> str:
        return (f"judged against the best's verdict timed beside this one (run {self.run_id}, "
                f"{self.apart_s / 60:.0f} min apart)")


def paired_verdict(verdicts: list[dict], cid: Optional[str], device: Optional[str], generation: str,
                   when: Optional[datetime]) -> Optional[Pair]:
    """Candidate `cid`'s finished, correct verify run on `device` with a uniform geomean, timed the same way
    (`generation`), closest in time to `when` and at most PAIR_WINDOW_S from it; None when it has none."""
    from kopt.policy import ranking

    if not cid or when is None:
        return None
    found = None
    for run in ranking.verdict_runs(verdicts, cid, device):
        rows = ranking.latest_finished([run])
        t = run_time(rows)
        if not rows or t is None or ranking.failed(rows) or timing_generation(rows) != generation:
            continue
        apart = abs((t - when).total_seconds())
        if apart <= PAIR_WINDOW_S and (found is None or apart < found.apart_s):
            g = ranking.geomeans(rows)
            if g.uniform is not None:
                found = Pair(str(rows[0].get("run_id") or "NA"), apart, g)
    return found


def best_side(verdicts: list[dict], best_cid: Optional[str], cid: Optional[str], device: Optional[str],
              generation: str, late: list[dict], uniform: Optional[float],
              ragged: Optional[float]) -> tuple[Optional[float], Optional[float], Optional[Pair]]:
    """The best's (uniform, ragged) geomeans to judge candidate `cid`'s verdict `late` against: those of the best
    candidate's verdict timed beside it (paired_verdict) when there is one, else the given ones; and that pair."""
    pair = None
    if late and best_cid and best_cid != cid:
        pair = paired_verdict(verdicts, best_cid, device, generation, run_time(late))
    return (pair.geomeans.uniform, pair.geomeans.ragged, pair) if pair else (uniform, ragged, None)


def current_candidate(ws: Path) -> Optional[str]:
    """candidate_id of the workspace's solution/tilelang/run_kernel.py (None when absent)."""
    from kopt.paths import default_candidate
    from kopt.store import candidate_hash

    return candidate_hash(default_candidate(ws))[1]


def snapshot_verdict(ws: Path) -> dict:
    """What a trajectory snapshot records of the workspace candidate's latest verdict: the SnapshotMeta fields
    (kopt.store.trajectory.write's `verdict`), its rows by id in ledger order; those of no verdict when it has
    none."""
    from kopt.policy import ranking

    cid = current_candidate(ws)
    rows = ranking.latest_verdict(_rows(ws), cid) if cid else []
    g = ranking.geomeans(rows)
    return dict(geomean=g.uniform, n_cases=g.n_uniform, geomean_ragged=g.ragged, n_ragged=g.n_ragged,
                pct_limit=g.pct_limit, pct_limit_ragged=g.pct_limit_ragged, verdict_rows=len(rows),
                failed=ranking.failed(rows), device=ranking.verdict_device(rows),
                rows=[str(r.get("row_id")) for r in rows])


def _rows(ws: Path) -> list[dict]:
    from kopt.paths import ledger_file
    from kopt.store import load_dicts

    return load_dicts(ledger_file(ws)).rows


def history(ws: Path, rows: Optional[list[dict]] = None) -> list[Iteration]:
    """Every committed iteration with its outcome under the improvement rule.

    Geomeans are compared per device: an iteration verified on an H200 is judged against the best
    earlier H200 iteration, never against a CPU one; the first verdict on a device is an improvement
    (the device's first best)."""
    from kopt.policy import ranking
    from kopt.store.trajectory import snapshots

    best: dict = {}
    thr: dict = {}
    out = []
    verdicts = None
    every = None
    for path, m in snapshots(ws):
        g = ranking.Geomeans(m.geomean, m.n_cases, m.geomean_ragged, m.n_ragged, m.pct_limit, m.pct_limit_ragged)
        failed, dev, gen, late = m.failed, m.device, "eager", None
        verdict_seen = m.verdict_rows > 0
        if m.candidate_id:  # the candidate's latest verdict in the ledger (on the snapshot's device) wins
            if verdicts is None:
                every = _rows(ws) if rows is None else rows
                verdicts = [r for r in every if r.get("mode") == "verdict"]
            late = ranking.latest_verdict(verdicts, m.candidate_id, dev if m.verdict_rows else None)
            if late:
                g, failed, dev = ranking.geomeans(late), ranking.failed(late), ranking.verdict_device(late)
                gen = timing_generation(late)
                verdict_seen = True
            elif m.verdict_rows == 0:
                failed = True
        if not verdict_seen:  # no verdict of its candidate: no outcome, whatever its bench lines read
            out.append(Iteration(m.iteration, m.label, m.candidate_id, None, 0, NOT_JUDGED, None, path.name, dev,
                                 reason=NOT_JUDGED_REASON))
            continue
        if dev not in thr:
            thr[dev] = threshold(ws, dev, rows)
        prev, prev_r, prev_cid = best.get((dev, gen), (None, None, None))
        prev, prev_r, pair = best_side(verdicts, prev_cid, m.candidate_id, dev, gen, late, prev, prev_r)
        j = judge(g.uniform, g.ragged, failed, prev, prev_r, thr[dev])
        if pair:
            j = replace(j, reason=f"{j.reason}; {pair.note()}")
        if late:
            j = weigh_heldout(j, late, every or [], thr[dev])
        if prev is None and j.outcome == "improved" and gen != "eager" and any(k[0] == dev for k in best):
            j = Judgement("improved", f"the first verdict on this device timed {GENERATIONS[gen]}: a new baseline "
                                      "(earlier verdicts were timed another way and are not compared with it)")
        out.append(Iteration(m.iteration, m.label, m.candidate_id, g.uniform, g.n_uniform, j.outcome, prev,
                             path.name, dev, g.ragged, g.n_ragged, g.pct_limit, g.pct_limit_ragged, prev_r, j.reason,
                             gen))
        if j.outcome == "improved":
            best[(dev, gen)] = (g.uniform, g.ragged, m.candidate_id)
    return out


def weigh_heldout(j: Judgement, late: list[dict], rows: list[dict], thr: float) -> Judgement:
    """The named rule's judgement weighed against the verdict's held-out draws, timed beside the reigning candidate
    on the same draws (module docstring): improved turns `overfit` when they lose beyond the threshold; not improved
    with the named geomeans held turns improved when they gain by it; the reason says the held-out ratio either way.
    Failed judgements, and verdicts without the reigning candidate's rows, are left as they are."""
    from kopt.policy import ranking

    if j.outcome not in ("improved", "not improved"):
        return j
    run_id = next((r.get("run_id") for r in late if r.get("run_id")), None)
    theirs = ranking.reigning_rows(rows, run_id)
    ratio = ranking.heldout_ratio(late, theirs)
    if ratio is None:
        return j
    who = ranking.row_cid(theirs[0]) if theirs else "the reigning candidate"
    held = f"held-out {(ratio - 1) * 100:+.1f}% against {who} on the same draws"
    if j.outcome == "improved" and ratio < 1 - thr:
        return Judgement("overfit", f"{j.reason}; but {held}: the named cases gain, the deployed shapes lose")
    if j.outcome == "not improved" and j.named_held and ratio >= 1 + thr:
        return Judgement("improved", f"{j.reason}; but {held}: the deployed shapes gain, the named cases hold",
                         True)
    return replace(j, reason=f"{j.reason}; {held}")


#: How a verdict's perf rows were timed, oldest first, as the status and the reasons say it.
GENERATIONS = {"eager": "eager spans", "device-only": "device-only on the stream",
               "graph": "device-only with graph replays"}


def timing_generation(rows: list[dict]) -> str:
    """How a verdict's perf rows were timed: "graph" (device-only calls replayed as CUDA graphs where both
    sides capture), "device-only" (enqueued on the stream ahead of the device behind a hold) or "eager"
    (older rows). Geomeans of two generations are not compared: eager spans of two-kernel calls held host
    launch gaps (FA2 on case 5: 0.0137 vs 0.0101 ms between runs), stream spans the device's launch gap
    between them (FA2 on case 5: 10.4 µs on the stream, 9.6 µs replayed)."""
    timed = [r["timing"] for r in rows if r.get("timing")]
    if not timed or not all(t.get("device_only") for t in timed):
        return "eager"
    return "graph" if all(t.get("replay") for t in timed) else "device-only"


#: The outcome of an iteration whose candidate has no verdict, and why.
NOT_JUDGED = "not judged"
NOT_JUDGED_REASON = ("no verdict of this candidate (`kopt verify`): bench lines and a quick verdict's screen are "
                     "signals, never judged")


def best_iteration(hist: list[Iteration], device: Optional[str] = None) -> Optional[Iteration]:
    """The last improving iteration (by the rule, the best so far), or None; with `device`, the
    last improving iteration on that device."""
    return next((it for it in reversed(hist) if it.outcome == "improved"
                 and (device is None or it.device == device)), None)


def judged_since(hist: list[Iteration]) -> list[Iteration]:
    """The judged iterations after the last improving one (all judged ones when none improved): not-judged
    iterations (no verdict) never count toward stagnation."""
    best = best_iteration(hist)
    return [it for it in hist if it.outcome != NOT_JUDGED and (best is None or it.iteration > best.iteration)]


def since_improvement(hist: list[Iteration]) -> int:
    """Judged iterations after the last improving one (judged_since)."""
    return len(judged_since(hist))


@dataclass
class IterPoint:
    """One iteration of the trajectory."""

    iteration: int
    candidate_id: Optional[str]
    geomean: Optional[float]
    outcome: str
    """improved | not improved | overfit | failed | not judged"""
    device: Optional[str] = None
    ragged: Optional[float] = None
    """Geomean speedup of the verdict over the ragged cases (None: none timed)."""
    reason: str = ""
    """The improvement rule's reason for the outcome."""
    heldout: Optional[float] = None
    """Geomean speedup of the verdict over its held-out draws (None: none timed)."""


def trajectory(ws: Path, rows: list[dict], use_git: bool = True,
               hist: Optional[list[Iteration]] = None) -> tuple[list[IterPoint], str]:
    """Git iterations when there are any (all devices); else verdicts grouped by candidate in timestamp
    order, judged by the same rule (judge). hist: history(ws, rows) when already computed."""
    from kopt.policy.ranking import failed, geomeans, latest_verdict, row_cid, verdict_device

    by_cid: dict[str, list[dict]] = {}  # one pass over the ledger, not one per candidate
    for r in rows:
        if r.get("mode") == "verdict" and r.get("kind", "case") == "case" and (cid := row_cid(r)):
            by_cid.setdefault(cid, []).append(r)

    def verdict(cid: Optional[str]) -> list[dict]:
        return latest_verdict(by_cid.get(cid, []), cid) if cid else []

    if not use_git:  # use_git only without a device filter: all rows
        hist = []
    elif hist is None:
        try:
            hist = history(ws, rows)
        except Exception:  # no git, no snapshots, an older layout: fall back to the ledger
            hist = []
    if hist:
        out = []
        for h in hist:
            g = geomeans(verdict(h.candidate_id))
            out.append(IterPoint(h.iteration, h.candidate_id, h.geomean, h.outcome, h.device,
                                 h.geomean_ragged or g.ragged, h.reason, g.heldout))
        return out, "git [iter N] commits"

    order = {cid: str(rs[0].get("timestamp") or "") for cid, rs in by_cid.items()}
    thr, best, best_r, out = threshold(ws, rows=rows), None, None, []
    for i, cid in enumerate(sorted(order, key=lambda k: order[k]), 1):
        v = verdict(cid)
        g = geomeans(v)
        gm, gr = g.uniform, g.ragged
        j = judge(gm, gr, failed(v), best, best_r, thr)  # the rule `history` applies
        j = weigh_heldout(j, v, rows, thr)
        if j.outcome == "improved":
            best, best_r = gm, gr
        out.append(IterPoint(i, cid, gm, j.outcome, verdict_device(v), gr, j.reason, g.heldout))
    return out, "ledger verdict rows by candidate" if out else "none"
