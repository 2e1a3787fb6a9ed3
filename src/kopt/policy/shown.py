"""Which candidate the report, the plots, `kopt status` and `kopt candidates` show: one rule, here.

The rule:

1. The shipped candidate: solution/tilelang/run_kernel.py of the workspace (what HEAD holds in a
   clean checkout, and what `kopt commit` is about to commit). Without one (a bare ledger), the
   top-ranked candidate of the ledger, labelled so.
2. Per case of the matrix (bench/cases.yaml, every kind), its row in the case's own variant: the
   candidate's latest verdict when that verdict timed the case, else its latest bench row on the
   verdict's device (the verdict times perf cases only), else none (NA, with the reason).
3. Beside it, only when it is another candidate: the best by the improvement rule (the last
   improving iteration, kopt.policy.iterations), with the reason it ranks there: the cases it leads on by more
   than the rule's threshold and whether those timings were noisy.

The improvement rule itself lives in kopt.policy.iterations; this module only reads its outcome.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, Field

from kopt.records import SPEEDUP_FMT, fmt_na


class CaseView(BaseModel):
    """The shown candidate on one case of the matrix."""

    case: int
    kind: str
    variant: str
    basis: Optional[Literal["verdict", "bench"]] = None
    """Where the row comes from; None when the case was not measured."""
    row: Optional[dict] = None
    """The raw ledger row (None = not measured)."""
    note: str = ""
    """Why the row is from a bench, or why there is none; a later bench figure when there is one."""


class BestByRule(BaseModel):
    """The best candidate by the improvement rule, when it is not the shown one."""

    candidate_id: str
    iteration: Optional[int] = None
    geomean: Optional[float] = None
    cases: list[int] = Field(default_factory=list)
    """Cases it leads the shown candidate on by more than the threshold."""
    reason: str


class RankedFirst(BaseModel):
    """The candidate the ranking puts first (by uniform geomean, over ranking_device), when it is not the shown
    one."""

    candidate_id: str
    geomean: Optional[float] = None
    basis: Optional[str] = None
    why: str = ""
    """Why the rule does not take it: its iteration's outcome, or that it is no committed iteration."""


class Shown(BaseModel):
    """What every view shows: the candidate, its verdict, one row per case, the rule's best beside it."""

    candidate_id: Optional[str] = None
    source: Literal["shipped", "ledger best", "none"] = "none"
    device: Optional[str] = None
    verdict_run: Optional[str] = None
    verdict_timing: Optional[str] = None
    """How the verdict's rows were timed (kopt.policy.iterations.GENERATIONS): verdicts timed another way
    are not compared with it, and its figures differ from bench rows timed another way."""
    verdict_geomean: Optional[float] = None
    """Geomean speedup of the verdict's timed uniform (edge and perf) cases."""
    verdict_geomean_ragged: Optional[float] = None
    """Geomean speedup of the verdict's timed ragged cases (None: none timed)."""
    verdict_stopped: str = ""
    """The candidate's last `kopt verify` run that stopped before its end, when it came after the verdict shown
    (or there is none): "run R: n of N rows". It is no verdict; run verify again."""
    verdict_timed: int = 0
    verdict_rows: int = 0
    verdict_correct: int = 0
    verdict_date: Optional[str] = None
    """The day (UTC, YYYY-MM-DD) of the shown verdict."""
    iteration: Optional[int] = None
    """The first iteration that holds the shown candidate (None: none does)."""
    outcome: str = ""
    """The improvement rule's latest outcome for it (its last iteration's), with the rule's reason."""
    commits: list[str] = Field(default_factory=list)
    """Commits the shown rows were measured at (their `commit` field), oldest row first."""
    cases: list[CaseView] = Field(default_factory=list)
    rule_best: Optional[str] = None
    """The best candidate by the improvement rule (the last improving iteration's), the shown one included."""
    best_by_rule: Optional[BestByRule] = None
    rule_best_elsewhere: Optional[str] = None
    """When no iteration improved on the shown device: the rule's best on another device, "ID (iteration N, on
    DEVICE)" (None: none improved anywhere)."""
    ranked_first: Optional[RankedFirst] = None

    def headline(self) -> str:
        """The first line of every view: which candidate is shipped, which is best by the rule and which the ranking
        puts first, and why they differ when they do."""
        if not self.candidate_id:
            return "no candidate yet: no solution/ and no candidate rows in the ledger"
        it = f"iteration {self.iteration}" if self.iteration is not None else "no iteration"
        what = "shipped" if self.source == "shipped" else "shown (no solution/; first in the ranking)"
        out = f"{what} {self.candidate_id} ({it}"
        out += f", verdict {self.verdict_date} on {self.device})" if self.verdict_date else ", no verdict)"
        b, r = self.best_by_rule, self.ranked_first
        if b is not None:
            one = "the shipped one" if self.source == "shipped" else "the shown one"
            why = (f"the rule judged {one} {self.outcome}" if self.outcome else
                   f"no iteration holds {one}, so the rule never judged it")
            out += f"; best by the improvement rule: {b.candidate_id} (iteration {b.iteration}), as {why}"
        elif self.rule_best == self.candidate_id:
            out += "; also the best by the improvement rule"
        elif self.rule_best_elsewhere:
            out += (f"; no iteration improved on {self.device}, so no best by the rule there (on another device: "
                    f"{self.rule_best_elsewhere})")
        else:
            out += "; no iteration improved yet, so no best by the rule"
        if r is not None:
            out += f"; first in the ranking by uniform geomean: {r.candidate_id} ({fmt_na(r.geomean, SPEEDUP_FMT)}"
            basis = {"signal": "bench"}.get(r.basis or "", r.basis)
            out += f", {basis} rows), {r.why}" if basis else f"), {r.why}"
        elif self.source == "shipped":
            out += "; also first in the ranking"
        return out

    def by_basis(self, basis: Optional[str]) -> list[int]:
        """Cases whose row comes from `basis` (None: not measured)."""
        return [c.case for c in self.cases if c.basis == basis]

    def summary(self) -> str:
        """One line for terminals: which candidate, then `detail()`."""
        if not self.candidate_id:
            return "no candidate yet"
        what = "shipped candidate" if self.source == "shipped" else "top-ranked candidate (no solution/)"
        return f"{what} {self.candidate_id}: {self.detail()}"

    def detail(self) -> str:
        """Its device, verdict, and where the rows not from the verdict come from."""
        rag = f", ragged {fmt_na(self.verdict_geomean_ragged, SPEEDUP_FMT)}" if self.verdict_geomean_ragged else ""
        how = f" ({self.verdict_timing})" if self.verdict_timing else ""
        v = (f"verdict {self.verdict_run}{how} {fmt_na(self.verdict_geomean, SPEEDUP_FMT)}{rag} over "
             f"{self.verdict_timed} timed cases, {self.verdict_correct}/{self.verdict_rows} rows correct"
             if self.verdict_run else "no verdict")
        parts = [f"on {self.device or 'NA'}, {v}"]
        if self.verdict_stopped:
            parts.append(f"a later verify stopped before its end ({self.verdict_stopped}): not a verdict")
        if b := self.by_basis("bench"):
            parts.append(f"bench rows for {_cases(b)}")
        if n := self.by_basis(None):
            parts.append(f"{_cases(n)} not measured")
        return "; ".join(parts)

    def lines(self) -> list[str]:
        """For terminals: the headline, the shown candidate and, when it is another one, the best by the rule."""
        out = [self.headline(), f"shown: {self.summary()}"]
        if b := self.best_by_rule:
            out.append(f"best by the improvement rule: {b.candidate_id} (iteration {b.iteration}, geomean "
                       f"{fmt_na(b.geomean, SPEEDUP_FMT)}): {b.reason}")
        return out

    def brief(self) -> dict:
        """JSON-ready form without the raw rows, with the headline every view opens with."""
        return {"headline": self.headline(), **self.model_dump(exclude={"cases": {"__all__": {"row"}}})}


def check_device(rows: list[dict], device: Optional[str]) -> Optional[str]:
    """`device` as the ledger names it (None stays None); a device no ledger row was measured on is a usage error,
    so a typo never reads as "no rows yet"."""
    if device is None:
        return None
    from kopt.errors import UsageError

    names = {}
    for r in rows:
        d = r.get("device")
        if d and d != "NA":
            names.setdefault(str(d).lower(), str(d))
    if device.lower() not in names:
        have = ", ".join(sorted(names.values(), key=str.lower)) or "none yet"
        raise UsageError(f"unknown device {device!r}: the ledger's rows were measured on {have}")
    return names[device.lower()]


def _cases(ids: list[int]) -> str:
    return ("case " if len(ids) == 1 else "cases ") + ranges(ids)


def ranges(ids: list[int]) -> str:
    """[1, 2, 3, 5] -> '1-3, 5'."""
    out, ids = [], sorted(ids)
    for i in ids:
        if out and i == out[-1][1] + 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in out)


def _timed(r: dict) -> bool:
    """A row that says how fast the case ran, or that it failed (untimed correctness rows do not)."""
    return r.get("runtime_ms") is not None or r.get("status", "ok") != "ok" or r.get("correct") is False


def _latest(rows: list[dict], cid: str, case: int, variants: tuple, device: Optional[str], mode: str):
    """(file index, row) of the candidate's latest timed row of `mode` on one case, or (None, None)."""
    from kopt.policy.ranking import row_cid

    for i in range(len(rows) - 1, -1, -1):
        r = rows[i]
        if (r.get("mode", "signal") == mode and r.get("kind", "case") == "case" and r.get("case") == case
                and (r.get("variant") or "") in variants and row_cid(r) == cid and _timed(r)
                and (device is None or str(r.get("device", "")).lower() == device.lower())):
            return i, r
    return None, None


def _case_views(ws: Path, rows: list[dict], cid: str, verdict: list[dict], device: Optional[str]) -> list[CaseView]:
    from kopt.cases import load_cases
    from kopt.paths import cases_file
    from kopt.policy.ranking import row_speedup

    index = {id(r): i for i, r in enumerate(rows)}
    out = []
    for c in load_cases(cases_file(ws)):
        variants = (c.variant.label(), "")  # "" : rows written before variants were labelled
        v = next((r for r in verdict if r.get("case") == c.id and (r.get("variant") or "") in variants
                  and _timed(r)), None)
        view = CaseView(case=c.id, kind=c.kind, variant=c.variant.label())
        j, later = _latest(rows, cid, c.id, variants, device, "signal")
        if v is not None:
            view.basis, view.row = "verdict", v
            if later is not None and j > index.get(id(v), -1) and later.get("runtime_ms"):
                view.note = (f"later bench {later['runtime_ms']:.4f} ms, {fmt_na(row_speedup(later), SPEEDUP_FMT)} "
                             f"(run {later.get('run_id') or 'NA'})")
        else:
            b = later
            if b is not None:
                view.basis, view.row = "bench", b
                view.note = (f"bench run {b.get('run_id') or 'NA'} ("
                             + ("the verdict times perf cases only" if c.kind == "edge" else
                                "no verdict row for this case" if verdict else "no verdict yet") + ")")
            else:
                view.note = (f"not measured: no verdict or bench row of {cid} in the case's variant "
                             f"({c.variant.label()}) on {device or 'any device'}")
        out.append(view)
    return out


def _own_device(rows: list[dict], cid: str, verdict: Optional[list[dict]] = None) -> Optional[str]:
    """The device of a candidate's latest finished verdict (`verdict` when already found), else of its newest row;
    None without either."""
    from kopt.policy import ranking

    if verdict is None:
        verdict = ranking.latest_finished(ranking.verdict_runs(rows, cid))
    mine = [r for r in rows if ranking.row_cid(r) == cid and r.get("kind", "case") == "case"]
    return ranking.verdict_device(verdict) or ranking.verdict_device(reversed(mine))


def ranking_device(ws: Path, rows: list[dict], device: Optional[str] = None) -> Optional[str]:
    """The device a ranking beside the shown candidate is over (times of different devices never share a rank):
    `device` when one is asked for; else the shipped candidate's own device (its latest verdict's); None (every row)
    without a shipped candidate or a row of it."""
    from kopt.policy.iterations import current_candidate

    if device:
        return device
    cid = current_candidate(Path(ws))
    return _own_device(rows, cid) if cid else None


def shown_candidate(ws: Path, rows: Optional[list[dict]] = None, device: Optional[str] = None,
                    points: Optional[list] = None, top: Optional[dict] = None) -> Shown:
    """The shown candidate under the module's rule. rows: the ledger's rows when already read;
    points: the iterations (kopt.policy.iterations.trajectory) when already computed; top: the ranking's first
    candidate (kopt.policy.ranking.best) over ranking_device(ws, rows, device), when already computed."""
    from kopt.paths import ledger_file
    from kopt.policy import ranking
    from kopt.policy.iterations import GENERATIONS, current_candidate, timing_generation
    from kopt.store import Loaded, load_dicts

    ws = Path(ws)
    rows = rows if rows is not None else load_dicts(ledger_file(ws)).rows
    everything = rows
    if device:
        rows = [r for r in rows if str(r.get("device", "")).lower() == device.lower()]
    s = Shown()
    cid = current_candidate(ws)
    if cid:
        s.candidate_id, s.source = cid, "shipped"
    else:
        top = top if top is not None else ranking.best_on(ledger_file(ws), device, Loaded(rows=everything))
        if not top:  # still one row per case: the tables say what is missing, they do not shrink
            from kopt.cases import load_cases
            from kopt.paths import cases_file

            s.cases = [CaseView(case=c.id, kind=c.kind, variant=c.variant.label(),
                                note="not measured: no candidate rows in the ledger yet")
                       for c in load_cases(cases_file(ws))]
            return s
        s.candidate_id, s.source = top["candidate_id"], "ledger best"
    cid = s.candidate_id
    runs = ranking.verdict_runs(rows, cid)
    verdict = ranking.latest_finished(runs)
    s.device = device or _own_device(rows, cid, verdict)
    if verdict:
        s.verdict_run = verdict[0].get("run_id")
        s.verdict_timing = GENERATIONS[timing_generation(verdict)]
        s.verdict_rows = len(verdict)
        s.verdict_correct = sum(r.get("correct") is True for r in verdict)
        s.verdict_date = str(verdict[0].get("timestamp") or "")[:10] or None
    if runs and not ranking.run_finished(runs[-1]):  # the last run stopped: after the verdict shown, if any
        last = runs[-1]
        s.verdict_stopped = f"run {last[0].get('run_id')}: {len(last)} of {ranking.planned_rows(last)} rows"
    s.cases = _case_views(ws, rows, cid, verdict, s.device)
    timed = [c for c in s.cases if c.basis == "verdict"]
    s.verdict_timed = len(timed)
    g = ranking.geomeans(c.row for c in timed)  # uniform and ragged cases apart, as the Verdict line has them
    s.verdict_geomean, s.verdict_geomean_ragged = g.uniform, g.ragged
    s.commits = list(dict.fromkeys(str(c.row["commit"]) for c in s.cases if c.row and c.row.get("commit")))
    if points is None:
        from kopt.policy.iterations import trajectory

        points, _ = trajectory(ws, rows, use_git=not device)  # git geomeans mix devices
    mine = [p for p in points if p.candidate_id == cid]
    if mine:
        s.iteration = mine[0].iteration  # where it came in; the rule's latest word on it below
        s.outcome = mine[-1].outcome + (f" ({mine[-1].reason})" if mine[-1].reason else "")
    rb = _rule_best(points, s.device)
    s.rule_best = rb.candidate_id if rb else None
    other = None if rb else _rule_best(points, None)
    if other is not None:
        s.rule_best_elsewhere = f"{other.candidate_id} (iteration {other.iteration}, on {other.device or 'NA'})"
    s.best_by_rule = _best_by_rule(ws, rows, s, points)
    if top is None:  # ranking_device's rule on what is at hand: the shipped candidate's device, else `device`
        top = ranking.best_on(ledger_file(ws), s.device if s.source == "shipped" else device, Loaded(rows=everything))
    s.ranked_first = _ranked_first(top, s, points)
    return s


def _rule_best(points: list, device: Optional[str]):
    """The last improving iteration on `device` (any device when None), or None."""
    return next((p for p in reversed(points) if p.outcome == "improved" and p.candidate_id
                 and (device is None or p.device is None or str(p.device).lower() == device.lower())), None)


def _ranked_first(top: Optional[dict], s: Shown, points: list) -> Optional[RankedFirst]:
    """The ranking's first candidate when it is neither the shown one nor the rule's best, with why the rule
    does not take it."""
    if not top or top.get("candidate_id") in (s.candidate_id, s.rule_best):
        return None
    cid = str(top["candidate_id"])
    mine = [p for p in points if p.candidate_id == cid]
    if mine:
        last = mine[-1]
        verb = last.outcome if last.outcome == "not judged" else f"judged {last.outcome}"
        why = f"iteration {mine[0].iteration}, {verb}" + (f" ({last.reason})" if last.reason else "")
    else:
        why = "no iteration holds it, so the rule never judged it"
    return RankedFirst(candidate_id=cid, geomean=top.get("geomean"), basis=top.get("basis"), why=why)


def _best_by_rule(ws: Path, rows: list[dict], s: Shown, points: list) -> Optional[BestByRule]:
    """The last improving iteration's candidate on the shown device, when it is another one."""
    from kopt.policy.iterations import threshold
    from kopt.policy.ranking import latest_verdict

    best = _rule_best(points, s.device)
    if best is None or best.candidate_id == s.candidate_id:
        return None
    thr = threshold(ws, s.device, rows)
    mine = {c.case: c.row for c in s.cases if c.basis == "verdict"}
    ahead = []
    for r in latest_verdict(rows, best.candidate_id):
        m = mine.get(r.get("case"))
        if m is None or (r.get("variant") or "") != (m.get("variant") or ""):
            continue
        so, sm = _speed(r), _speed(m)
        if so and sm and so > sm * (1 + thr):
            ahead.append((r["case"], so, sm, _noise(r, m)))
    rag = (f", ragged {fmt_na(best.ragged, SPEEDUP_FMT)} against {fmt_na(s.verdict_geomean_ragged, SPEEDUP_FMT)}"
           if best.ragged or s.verdict_geomean_ragged else "")
    head = (f"iteration {best.iteration}'s verdict geomean {fmt_na(best.geomean, SPEEDUP_FMT)} against the shown "
            f"{fmt_na(s.verdict_geomean, SPEEDUP_FMT)}{rag}" if s.verdict_geomean else
            f"iteration {best.iteration}'s verdict geomean {fmt_na(best.geomean, SPEEDUP_FMT)}; the shown candidate "
            "has no verdict geomean")
    if ahead:
        cases = "; ".join(f"case {c} {so:.3f}x vs {sm:.3f}x ({n or 'timings not flagged noisy'})"
                          for c, so, sm, n in ahead)
        head += f"; ahead by more than the +{thr:.1%} threshold on {cases}"
        if all(n for *_, n in ahead):
            head += "; every case it leads on rests on a noisy timing"
    else:
        head += f"; no case ahead by more than the +{thr:.1%} threshold (a spread lead)"
    if best.reason:
        head += f" (the rule at iteration {best.iteration}: {best.reason})"
    return BestByRule(candidate_id=best.candidate_id, iteration=best.iteration, geomean=best.geomean,
                      cases=[c for c, *_ in ahead], reason=head)


def _speed(r: dict) -> Optional[float]:
    from kopt.policy.ranking import row_speedup

    return row_speedup(r) if r.get("correct") is True else None


def _noise(other: dict, mine: dict) -> str:
    """Which timings behind a comparison were flagged noisy, with their relative IQR."""
    from kopt.policy.ranking import noisy_sides

    out = []
    for who, r in (("its", other), ("the shown", mine)):
        side = noisy_sides(r)
        for key, name in (("timing", "candidate"), ("ref_timing", "baseline")):
            if side in (name if name == "candidate" else "ref", "both"):
                iqr = (r.get(key) or {}).get("rel_iqr")
                out.append(f"{who} {name} timing noisy, rel IQR {iqr:.1%}" if iqr is not None else
                           f"{who} {name} timing noisy")
    return ", ".join(out)
