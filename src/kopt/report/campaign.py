"""What the plots and the report show, read once: the shown candidate (kopt.policy.shown) on every case of
the matrix, the iterations with their outcomes, and peer rows.

Iterations come from git `[iter N]` commits (trajectory snapshots, kopt.policy.iterations.trajectory) or, without
them, from verdict rows grouped by candidate_id in timestamp order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from kopt.policy import IterPoint

#: The reason a % of limit is NA on rows written before rows recorded the roofline limit.
NO_LIMIT = "not measured: rows before the limit was recorded"


@dataclass
class CaseRow:
    """The shown candidate on one case: every figure, None where not measured (reason in `na`)."""

    case: int
    kind: str
    variant: str
    batch: int
    seqlen_k: int
    kv_heads: int
    gqa: int
    valid_keys: int
    c500_ref_ms: Optional[float]
    basis: Optional[str] = None
    """verdict | bench | None (not measured)."""
    speedup: Optional[float] = None
    ci: Optional[tuple] = None
    runtime_ms: Optional[float] = None
    ref_runtime_ms: Optional[float] = None
    gbps: Optional[float] = None
    pct_peak: Optional[float] = None
    ceiling: str = ""
    """What pct_peak is a share of: read (rows that record the limit) or copy (older rows)."""
    pct_limit: Optional[float] = None
    correct: Optional[bool] = None
    status: str = "NA"
    ref: str = "NA"
    device: str = "NA"
    noisy: str = ""
    note: str = ""
    na: dict = field(default_factory=dict)
    """field -> why it is NA."""


@dataclass
class Campaign:
    """What the plots and the report show."""

    shown: object = None
    """kopt.policy.shown.Shown."""
    rows: list[CaseRow] = field(default_factory=list)
    trajectory: list[IterPoint] = field(default_factory=list)
    trajectory_source: str = "none"
    backend: str = "tilelang"
    ceiling_gbps: Optional[float] = None
    ceiling_kind: str = ""
    peers: dict = field(default_factory=dict)
    """device slug -> kopt.report.panel.Panel of that device's newest `kopt peers` run."""
    ledger: object = None
    """kopt.store.ledger.Loaded: the whole ledger as read once (every device's rows, the lines skipped)."""
    hardware: object = None
    """kopt.hardware's cached entry of the shown verdict's device (results/hardware-*.json: its read ceiling and
    launch floor), read once; None where none was measured."""

    @property
    def floor_ms(self) -> Optional[float]:
        """The launch floor of the shown verdict's device, where it was measured."""
        return self.hardware.floor_ms if self.hardware is not None else None

    @property
    def skipped(self) -> int:
        """Ledger lines skipped as unreadable."""
        return len(self.ledger.skipped) if self.ledger else 0

    def newest(self) -> dict[str, str]:
        """Per device (as the ledger names it), the day of its newest row: one device's fresh rows never date
        another's."""
        out: dict[str, str] = {}
        for r in self.ledger.rows if self.ledger else []:
            d, t = str(r.get("device") or "NA"), str(r.get("timestamp") or "")[:10]
            if t and d != "NA" and t > out.get(d, ""):  # NA: bookkeeping rows (stagnation), no device
                out[d] = t
        return dict(sorted(out.items(), key=lambda kv: kv[0].lower()))

    @property
    def best_id(self) -> Optional[str]:
        """The shown candidate's id (the name older callers use)."""
        return self.shown.candidate_id if self.shown else None

    def stamp(self) -> str:
        """Which candidate and data a figure shows, for its footer."""
        s = self.shown
        if not s or not s.candidate_id:
            return "kopt: no candidate rows yet"
        commits = ", ".join(s.commits[-3:]) or "NA"
        rule = f"best by the rule {s.rule_best}" if s.rule_best else "no best by the rule yet"
        return (f"kopt: {s.source} candidate {s.candidate_id}, verdict run {s.verdict_run or 'none'} on "
                f"{s.device or 'NA'}; {rule}; measured at commit {commits}; {len(self.rows)} cases")

    def marker(self) -> dict[str, str]:
        """Machine-readable identity (PNG text chunks, report meta tags): checked against the data."""
        s = self.shown
        return {"kopt-candidate": (s.candidate_id if s else None) or "none",
                "kopt-source": s.source if s else "none", "kopt-cases": str(len(self.rows)),
                "kopt-rule-best": (s.rule_best if s else None) or "none",
                "kopt-verdict-run": (s.verdict_run if s else None) or "none"}


def _na(r: Optional[dict], view_note: str) -> dict[str, str]:
    """Why each figure of a row is NA (only the NA ones)."""
    names = ("runtime_ms", "ref_runtime_ms", "speedup", "ci", "gbps", "pct_peak", "pct_limit")
    if r is None:
        return {k: view_note for k in names}
    from kopt.policy.ranking import row_speedup

    st = str(r.get("status", "ok"))
    failed = f"not measured: the case failed ({st})" if st not in ("ok", "baseline_error") else None
    val = {"runtime_ms": r.get("runtime_ms"), "ref_runtime_ms": r.get("ref_runtime_ms"), "speedup": row_speedup(r),
           "ci": r.get("speedup_ci"), "gbps": r.get("gbps"), "pct_peak": r.get("pct_peak"),
           "pct_limit": r.get("pct_limit")}
    why = {"runtime_ms": "not measured: not timed",
           "ref_runtime_ms": "not measured: the baseline failed" if st == "baseline_error" else
           "not measured: the baseline was not timed",
           "speedup": "not measured: no baseline time", "ci": "not measured: no CI recorded (no paired rounds)",
           "gbps": "not measured: no byte count in the row",
           "pct_peak": "not measured: no measured ceiling on this device",
           "pct_limit": NO_LIMIT if r.get("limit_ms") is None else "not measured: not timed"}
    return {k: failed or why[k] for k, v in val.items() if v is None}


def _case_row(case, view) -> CaseRow:
    from kopt.policy.ranking import noisy_sides, row_speedup

    c = CaseRow(case.id, case.kind, view.variant, case.batch, case.seqlen_k, case.kv_heads, case.gqa,
                case.valid_keys, case.c500_ref_ms, view.basis, note=view.note)
    r = view.row
    c.na = _na(r, view.note)
    if r is None:
        return c
    ci = r.get("speedup_ci")
    c.speedup = row_speedup(r)
    c.ci = tuple(ci) if isinstance(ci, (list, tuple)) and len(ci) == 2 else None
    for k in ("runtime_ms", "ref_runtime_ms", "gbps", "pct_peak", "pct_limit"):
        setattr(c, k, r.get(k))
    c.ceiling = "read" if r.get("limit_ms") is not None or (r.get("schema_version") or 1) >= 2 else "copy"
    c.correct, c.status = r.get("correct") is True, str(r.get("status", "NA"))
    c.ref, c.device, c.noisy = str(r.get("ref", "NA")), str(r.get("device", "NA")), noisy_sides(r)
    return c


def _peers(rows: list[dict], kinds: dict[int, str], shown=None) -> dict:
    """The newest `kopt peers` run of each device that has one, as panels (kopt.report.panel), each marked stale
    when it timed another candidate than the shown one."""
    from kopt.report import panel

    devices = dict.fromkeys(str(r.get("device", "NA")) for r in rows if r.get("mode") == "peers")
    out = {}
    for dev in devices:
        run = panel.latest_rows(rows, dev)
        if run:
            p = panel.build(run, kinds)
            if shown is not None:
                p.mark_stale(shown.candidate_id, shown.verdict_date)
            out[p.slug] = p  # the file name kopt peers gives its plot
    return out


def load_campaign(ws: Path, device: Optional[str] = None) -> Campaign:
    """The shown candidate on every case (with C500 reference times), the trajectory, peer rows."""
    from kopt.cases import load_cases
    from kopt.paths import cases_file, ledger_file
    from kopt.policy import shown_candidate
    from kopt.policy.iterations import trajectory
    from kopt.store import load_dicts

    ws = Path(ws)
    c = Campaign()
    c.ledger = load_dicts(ledger_file(ws))
    rows = c.ledger.rows
    from kopt.policy import check_device

    device = check_device(rows, device)  # before any figure is drawn
    if device:
        rows = [r for r in rows if str(r.get("device", "")).lower() == device.lower()]
    # Iteration geomeans in git snapshots mix devices; a per-device view rebuilds them from its own rows.
    c.trajectory, c.trajectory_source = trajectory(ws, rows, use_git=not device)
    c.shown = shown_candidate(ws, rows, device, points=c.trajectory)
    cases = {x.id: x for x in load_cases(cases_file(ws))}
    c.rows = [_case_row(cases[v.case], v) for v in c.shown.cases]
    measured = [v.row for v in c.shown.cases if v.row]
    c.backend = next((r.get("backend") for r in measured if r.get("backend") not in (None, "", "NA")), None) or ""
    if not c.backend:
        from kopt.paths import default_candidate
        from kopt.profile.runner import declared_backend

        declared = declared_backend(default_candidate(ws))
        c.backend = declared if declared != "NA" else "tilelang"
    for kind in ("read", "copy"):  # the read ceiling where rows record it
        got = next((r.gbps * 100 / r.pct_peak for r in c.rows if r.ceiling == kind and r.gbps and r.pct_peak), None)
        if got:
            c.ceiling_gbps, c.ceiling_kind = got, kind
            break
    c.peers = _peers(rows, {k: x.kind for k, x in cases.items()}, c.shown)
    if c.shown.device:
        from kopt.hardware import read_cached

        c.hardware = read_cached(c.shown.device, ws / "results")
    return c
