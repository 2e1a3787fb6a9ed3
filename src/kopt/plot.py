"""`kopt plot`: campaign figures (matplotlib, Agg, PNG) from the ledger and the case matrix.

- speedup.png: per-case SPEEDUP of the best candidate against the baseline (FA2 where it ran),
  with bootstrap-CI error bars; beside it measured runtimes next to the seed's C500 reference times
  (reference data from another device, shown, never compared as a measurement).
- bandwidth.png: per-case achieved GB/s (bytes a call must move / RUNTIME) against the measured
  copy ceiling (the roofline of a memory-bound decode).
- trajectory.png: geomean speedup per iteration and the best so far; non-improving iterations
  marked. Iterations come from git `[iter N]` commits (trajectory snapshots, kopt.loop.history)
  or, without them, from verdict rows grouped by candidate_id in timestamp order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

C500_NOTE = "C500 seed reference (other device: reference data, not a measurement)"


@dataclass
class CaseRow:
    """The best candidate's latest row on one case."""

    case: int
    variant: str
    speedup: Optional[float]
    ci: Optional[tuple]
    runtime_ms: Optional[float]
    ref_runtime_ms: Optional[float]
    gbps: Optional[float]
    pct_peak: Optional[float]
    c500_ref_ms: Optional[float]
    correct: bool
    status: str
    ref: str
    device: str


@dataclass
class IterPoint:
    """One iteration of the trajectory."""

    iteration: int
    candidate_id: Optional[str]
    geomean: Optional[float]
    outcome: str
    """improved | not improved | failed"""


@dataclass
class Campaign:
    """What the plots and the report show."""

    best_id: Optional[str] = None
    best: dict = field(default_factory=dict)
    basis: str = "NA"
    rows: list[CaseRow] = field(default_factory=list)
    trajectory: list[IterPoint] = field(default_factory=list)
    trajectory_source: str = "none"
    backend: str = "tilelang"
    ceiling_gbps: Optional[float] = None
    skipped: int = 0


def _best_rows(rows: list[dict], cid: str) -> tuple[list[dict], str]:
    """Latest verdict rows of a candidate, else its latest signal/tune row per (case, variant)."""
    from kopt.ranking import CANDIDATE_MODES, latest_verdict, row_cid

    v = latest_verdict(rows, cid)
    if v:
        return v, "verdict"
    latest = {}
    for r in rows:
        if row_cid(r) == cid and r.get("mode", "signal") in CANDIDATE_MODES and r.get("kind", "case") == "case":
            latest[(r.get("case"), r.get("variant") or "")] = r
    return sorted(latest.values(), key=lambda r: (r.get("case") or 0, r.get("variant") or "")), "signal"


def load_campaign(ws: Path, device: Optional[str] = None) -> Campaign:
    """Best candidate, its per-case rows with C500 reference times, and the trajectory (one device's rows)."""
    from kopt import ranking
    from kopt.cases import load_cases
    from kopt.ledger import load_dicts
    from kopt.paths import cases_file, ledger_file

    c = Campaign()
    loaded = load_dicts(ledger_file(ws))
    rows, c.skipped = loaded.rows, len(loaded.skipped)
    if device:
        rows = [r for r in rows if str(r.get("device", "")).lower() == device.lower()]
    df, _ = ranking.load_frame(ledger_file(ws), device, loaded)
    top = ranking.best(df)
    c500 = {x.id: x.c500_ref_ms for x in load_cases(cases_file(ws))}
    if top:
        c.best, c.best_id = top, top["candidate_id"]
        best, c.basis = _best_rows(rows, c.best_id)
        c.rows = [_case_row(r, c500) for r in best]
        c.backend = next((r.get("backend") for r in best if r.get("backend") not in (None, "", "NA")), c.backend)
    if not c.rows:
        from kopt.paths import default_candidate
        from kopt.profile.runner import declared_backend

        declared = declared_backend(default_candidate(ws))
        c.backend = declared if declared != "NA" else c.backend
    c.ceiling_gbps = next((r.gbps * 100 / r.pct_peak for r in c.rows if r.gbps and r.pct_peak), None)
    # Iteration geomeans in git snapshots mix devices; a per-device view rebuilds them from its own rows.
    c.trajectory, c.trajectory_source = _trajectory(ws, rows, use_git=not device)
    return c


def _case_row(r: dict, c500: dict) -> CaseRow:
    from kopt.ranking import row_speedup

    ci = r.get("speedup_ci")
    return CaseRow(int(r.get("case") or 0), r.get("variant") or "", row_speedup(r),
                   tuple(ci) if isinstance(ci, (list, tuple)) and len(ci) == 2 else None,
                   r.get("runtime_ms"), r.get("ref_runtime_ms"), r.get("gbps"), r.get("pct_peak"),
                   c500.get(r.get("case")), r.get("correct") is True, str(r.get("status", "NA")),
                   str(r.get("ref", "NA")), str(r.get("device", "NA")))


def _trajectory(ws: Path, rows: list[dict], use_git: bool = True) -> tuple[list[IterPoint], str]:
    """Git iterations when there are any (all devices); else verdicts grouped by candidate in timestamp order."""
    try:
        from kopt.loop import history

        hist = history(ws, rows) if use_git else []  # use_git only without a device filter: all rows
    except Exception:  # no git, no snapshots, an older layout: fall back to the ledger
        hist = []
    if hist:
        return [IterPoint(h.iteration, h.candidate_id, h.geomean, h.outcome) for h in hist], "git [iter N] commits"
    from kopt.loop import outcome, threshold
    from kopt.ranking import failed, geomean_of, latest_verdict, row_cid

    order: dict[str, str] = {}
    for r in rows:
        if r.get("mode") == "verdict" and r.get("kind", "case") == "case" and row_cid(r):
            order.setdefault(row_cid(r), str(r.get("timestamp") or ""))
    thr, best, out = threshold(ws), None, []
    for i, cid in enumerate(sorted(order, key=lambda k: order[k]), 1):
        v = latest_verdict(rows, cid)
        gm, _ = geomean_of(v)
        got = outcome(gm, failed(v), best, thr)
        best = gm if got == "improved" else best
        out.append(IterPoint(i, cid, gm, got))
    return out, "ledger verdict rows by candidate" if out else "none"


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray")
    ax.set_xticks([])
    ax.set_yticks([])


def plot_speedup(c: Campaign, path: Path) -> Path:
    """Per-case SPEEDUP with CI bars, and runtimes beside the C500 reference times."""
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.5))
    rows = [r for r in c.rows if r.speedup]
    if rows:
        x = range(len(rows))
        sp = [r.speedup for r in rows]
        err = [[max(0.0, s - r.ci[0]) if r.ci else 0.0 for s, r in zip(sp, rows)],
               [max(0.0, r.ci[1] - s) if r.ci else 0.0 for s, r in zip(sp, rows)]]
        colors = ["tab:green" if r.ci and r.ci[0] > 1 else "tab:red" if r.ci and r.ci[1] < 1 else "tab:gray"
                  for r in rows]
        a1.bar(x, sp, yerr=err, capsize=3, color=colors)
        a1.axhline(1.0, color="black", lw=0.8, ls="--")
        a1.set_xticks(list(x), [f"{r.case}" for r in rows])
        a1.set_xlabel("case")
        a1.set_ylabel(f"SPEEDUP vs {rows[0].ref} (95% CI)")
        a1.set_title(f"best candidate {c.best_id} ({c.basis})")
    else:
        _empty(a1, "no SPEEDUP rows in candidates.jsonl yet")
    t = [r for r in c.rows if r.runtime_ms or r.c500_ref_ms]
    if t:
        x = list(range(len(t)))
        w = 0.27
        a2.bar([i - w for i in x], [r.runtime_ms or 0 for r in t], w, label="candidate (measured)")
        a2.bar(x, [r.ref_runtime_ms or 0 for r in t], w, label="baseline (measured)")
        a2.bar([i + w for i in x], [r.c500_ref_ms or 0 for r in t], w, hatch="//", color="lightgray",
               edgecolor="gray", label=C500_NOTE)
        a2.set_yscale("log")
        a2.set_xticks(x, [str(r.case) for r in t])
        a2.set_xlabel("case")
        a2.set_ylabel("ms per call")
        a2.legend(fontsize=7)
        a2.set_title(f"runtimes on {t[0].device} vs C500 reference times")
    else:
        _empty(a2, "no runtimes yet")
    return _save(fig, path)


def plot_bandwidth(c: Campaign, path: Path) -> Path:
    """Achieved GB/s per case against the measured copy ceiling."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    rows = [r for r in c.rows if r.gbps]
    if rows:
        x = list(range(len(rows)))
        ax.bar(x, [r.gbps for r in rows], color="tab:blue")
        for i, r in zip(x, rows):
            if r.pct_peak is not None:
                ax.text(i, r.gbps, f"{r.pct_peak:.0f}%", ha="center", va="bottom", fontsize=7)
        if c.ceiling_gbps:
            ax.axhline(c.ceiling_gbps, color="red", ls="--", label=f"measured copy ceiling {c.ceiling_gbps:.0f} GB/s")
            ax.legend(fontsize=8)
        ax.set_xticks(x, [str(r.case) for r in rows])
        ax.set_xlabel("case")
        ax.set_ylabel("GB/s (bytes a call must move / RUNTIME)")
        ax.set_title("% of copy bandwidth" + ("" if c.ceiling_gbps else " (no measured ceiling: NA)"))
    else:
        _empty(ax, "no GB/s figures yet")
    return _save(fig, path)


def plot_trajectory(c: Campaign, path: Path) -> Path:
    """Geomean per iteration, the best so far, non-improving iterations marked."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    pts = c.trajectory
    if pts:
        best, run = None, []
        for p in pts:
            best = p.geomean if p.outcome == "improved" else best
            run.append(best if best is not None else math.nan)
        ax.step([p.iteration for p in pts], run, where="post", color="tab:green", label="best so far")
        for outcome, style in (("improved", dict(marker="o", color="tab:green")),
                               ("not improved", dict(marker="x", color="tab:orange")),
                               ("failed", dict(marker="x", color="tab:red"))):
            sel = [p for p in pts if p.outcome == outcome]
            if sel:
                ys = [p.geomean if p.geomean else (min(run) if not all(math.isnan(v) for v in run) else 1.0)
                      for p in sel]
                ax.scatter([p.iteration for p in sel], ys, label=outcome, zorder=3, **style)
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlim(pts[0].iteration - 0.5, pts[-1].iteration + 0.5)
        ax.set_xlabel("iteration")
        ax.set_ylabel("geomean SPEEDUP")
        ax.legend(fontsize=8)
        ax.set_title(f"trajectory ({c.trajectory_source})")
    else:
        _empty(ax, "no verdict iterations yet (for this device)" if c.trajectory_source == "none" else "no iterations yet")
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)
    plt.close(fig)
    return path


def make_plots(ws: Path, out: Optional[Path] = None, campaign: Optional[Campaign] = None,
               device: Optional[str] = None) -> list[Path]:
    """Write speedup.png, bandwidth.png and trajectory.png; default folder results/<backend>/plots/."""
    import matplotlib

    matplotlib.use("Agg")
    c = campaign or load_campaign(ws, device)
    out = Path(out) if out else ws / "results" / c.backend / "plots"
    return [plot_speedup(c, out / "speedup.png"), plot_bandwidth(c, out / "bandwidth.png"),
            plot_trajectory(c, out / "trajectory.png")]
