"""The peer panel: ledger rows of mode=peers as a table per case, geomeans, a CSV, markdown, HTML, a plot.

Rows are read as raw dicts (as the ranking reads them), so the report and the plots can call this
on ledger rows directly. Each case's row holds every peer: its time, the candidate's paired speedup
over it with the CI, or NA with the reason; the best peer is the fastest one whose output was correct.
"""

from __future__ import annotations

import csv
import html
import io
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from kopt.records import fmt_na
from kopt.timing.stats import geomean


@dataclass
class Cell:
    """One peer on one case."""

    peer: str
    ref: str
    ms: Optional[float] = None
    cand_ms: Optional[float] = None
    speedup: Optional[float] = None
    ci: Optional[tuple] = None
    na: Optional[str] = None
    """Why there is no figure: the peer's NA reason, or `wrong: ...` when its output failed the check."""
    noisy: Optional[bool] = None
    eager_ms: Optional[float] = None
    """The peer's host-inclusive span (its launches included: FA3 launches two or three kernels)."""
    cand_eager_ms: Optional[float] = None
    row: dict = field(default_factory=dict, repr=False)

    @property
    def usable(self) -> bool:
        """Timed, correct, with a speedup: may be the best peer."""
        return self.na is None and self.ms is not None and self.speedup is not None


@dataclass
class PanelRow:
    """One case of the panel."""

    case: int
    kind: str
    variant: str
    status: str
    runtime_ms: Optional[float]
    cells: dict[str, Cell]

    @property
    def best(self) -> Optional[Cell]:
        """The fastest usable named peer (None when no peer ran correctly); an earlier candidate's file (`cand-<id>`)
        only where no named peer ran."""
        from kopt.baselines import named_first

        ok = [c for c in self.cells.values() if c.usable]
        return min(named_first(ok), key=lambda c: c.ms) if ok else None


@dataclass
class Panel:
    """Every case of one `kopt peers` run."""

    peers: list[str]
    rows: list[PanelRow]
    device: str = "NA"
    run_id: str = "NA"
    candidate_id: str = "NA"
    date: str = "NA"
    commit: str = "NA"
    stale: str = ""
    """Why this panel is not of the shown candidate (set where it is shown beside one: kopt.report.campaign)."""
    stale_age: str = ""
    """Its age against the shown candidate's verdict, e.g. "3 days before the shown candidate's verdict"."""

    def mark_stale(self, shown_id: Optional[str], shown_date: Optional[str]) -> str:
        """Set and return `stale`: empty when the panel timed the shown candidate, else its candidate and its age
        against the shown candidate's verdict."""
        self.stale_age = ""
        if not shown_id or self.candidate_id == shown_id:
            self.stale = ""
            return ""
        age = ""
        try:
            from datetime import date

            days = (date.fromisoformat(str(shown_date)) - date.fromisoformat(self.date)).days
            self.stale_age = (f"{days} day{'s' if days != 1 else ''} before the shown candidate's verdict"
                              if days > 0 else f"the shown candidate's verdict is of {shown_date}")
            age = f", {self.stale_age}" + (f" ({shown_date})" if days > 0 else "")
        except (TypeError, ValueError):  # a date missing on either side: the candidate alone says it
            pass
        self.stale = (f"stale: this panel timed candidate {self.candidate_id} on {self.date}{age}, not the shown "
                      f"candidate {shown_id}; run kopt peers to time it")
        return self.stale

    @property
    def slug(self) -> str:
        """The device as file names carry it (peers-<slug>-<date>.csv, plots/peers-<slug>.png)."""
        return self.device.lower().replace(" ", "_")

    def geomean_best(self, kinds: Optional[set] = None) -> tuple[Optional[float], int]:
        """Geomean of the speedup over the best peer per case (of these kinds), and the number of cases."""
        sp = [r.best.speedup for r in self.rows if r.best and (kinds is None or r.kind in kinds)]
        return geomean(sp), len(sp)

    def geomean_peer(self, peer: str) -> tuple[Optional[float], int]:
        """Geomean of the speedup over one peer, over the cases it ran correctly."""
        sp = [r.cells[peer].speedup for r in self.rows if peer in r.cells and r.cells[peer].usable]
        return geomean(sp), len(sp)


def is_ab(rows: list[dict]) -> bool:
    """Whether a peers run (its rows as dicts) timed an earlier candidate's file (`--peers ...,OLD.py`): an A/B of a
    kernel change, not the panel of peer kernels."""
    from kopt.baselines import CANDIDATE_PEER

    return any(p.get("peer", "").startswith(CANDIDATE_PEER) for r in rows for p in r.get("peers") or [])


def latest_rows(rows: list[dict], device: Optional[str] = None) -> list[dict]:
    """The case rows of the newest mode=peers run (of one device when given) that timed peer kernels only (an A/B
    run against an earlier candidate's file is not the panel)."""
    mine = [r for r in rows if r.get("mode") == "peers" and r.get("kind", "case") == "case"
            and (device is None or str(r.get("device", "")).lower() == device.lower())]
    runs: dict = {}
    for r in mine:
        runs.setdefault(r.get("run_id"), []).append(r)
    panels = [run for run in runs.values() if not is_ab(run)]
    return panels[-1] if panels else []


def _cell(p: dict) -> Cell:
    t, rt = p.get("timing") or {}, p.get("ref_timing") or {}
    na = p.get("na")
    if na is None and p.get("correct") is False:
        na = f"wrong: {p.get('message') or 'output outside tolerance'}"
    ci = p.get("speedup_ci")
    return Cell(p.get("peer", "?"), p.get("ref") or "NA", rt.get("median_ms"), t.get("median_ms"), p.get("speedup"),
                tuple(ci) if ci else None, na, rt.get("noisy"), rt.get("eager_median_ms"), t.get("eager_median_ms"), p)


def build(rows: list[dict], kinds: Optional[dict[int, str]] = None) -> Panel:
    """The panel of these rows (one run); `kinds` maps case id -> kind (edge, perf, ragged)."""
    from kopt.baselines import PEERS

    prs, seen = [], set()
    for r in rows:
        cells = {c.peer: c for c in map(_cell, r.get("peers") or [])}
        seen |= set(cells)
        case = int(r.get("case") or 0)
        kind = r.get("case_kind") if r.get("case_kind") in ("seed", "heldout", "custom") else None
        variant = r.get("variant") or "NA"
        if r.get("model"):  # a held-out draw's id is a position in its draw: its model and shape name it
            variant = f"{r['model']} {r.get('shape') or ''} {variant}"
        prs.append(PanelRow(case, kind or (kinds or {}).get(case, "NA"), variant, str(r.get("status", "NA")),
                            r.get("runtime_ms"), cells))
    first = rows[0] if rows else {}
    return Panel([p for p in PEERS if p in seen] + sorted(seen - set(PEERS)), prs, str(first.get("device", "NA")),
                 str(first.get("run_id", "NA")), str(first.get("candidate_id", "NA")),
                 str(first.get("timestamp") or "NA")[:10], str(first.get("commit") or "NA"))


def _x(v: Optional[float]) -> str:
    return fmt_na(v, "{:.2f}x")


def _ci(ci: Optional[tuple]) -> str:
    return f"{ci[0]:.2f}-{ci[1]:.2f}" if ci else "NA"


def table(p: Panel) -> tuple[list[str], list[list[str]]]:
    """Header and cells of the panel: per peer its time (ms) and the candidate's speedup over it."""
    head = ["case", "kind", "variant", "candidate ms"] + [f"{n} ms (x)" for n in p.peers] + \
        ["best peer", "speedup over best", "95% CI"]
    body = []
    for r in p.rows:
        cells = []
        for n in p.peers:
            c = r.cells.get(n)
            cells.append("NA" if c is None or not c.usable else f"{c.ms:.4f} ({_x(c.speedup)})")
        b = r.best
        body.append([str(r.case), r.kind, r.variant, fmt_na(r.runtime_ms)] + cells +
                    [b.peer if b else "NA", _x(b.speedup if b else None), _ci(b.ci if b else None)])
    return head, body


def notes(p: Panel) -> list[str]:
    """Geomeans (over the best peer per case; per peer over the cases it ran) and every NA reason."""
    gm, n = p.geomean_best()
    out = [f"geomean speedup over the best peer per case: {_x(gm)} ({n} of {len(p.rows)} cases)"]
    groups = (("edge + perf", {"edge", "perf"}), ("ragged", {"ragged"}), ("seed", {"seed"}),
              ("held-out", {"heldout"}), ("custom", {"custom"}))
    present = [(label, ks) for label, ks in groups if any(r.kind in ks for r in p.rows)]
    if len(present) > 1:
        for label, ks in present:
            g, k = p.geomean_best(ks)
            out.append(f"  {label}: {_x(g)} ({k} cases)")
    for peer in p.peers:
        g, k = p.geomean_peer(peer)
        refs = sorted({c.ref for r in p.rows if (c := r.cells.get(peer)) and c.usable})
        if k:
            out.append(f"geomean speedup over {peer} ({', '.join(refs)}): {_x(g)} ({k} cases)")
    why: dict[tuple, list[int]] = {}
    for r in p.rows:
        for c in r.cells.values():
            if not c.usable:
                why.setdefault((c.peer, c.na or "no figure"), []).append(r.case)
    out += [f"NA {peer} on case(s) {_ids(cs)}: {reason}" for (peer, reason), cs in why.items()]
    return out


def _ids(cs: list[int]) -> str:
    """1,2,3,5 -> 1-3,5."""
    from kopt.policy.shown import ranges

    return ranges(set(cs)).replace(", ", ",")


def markdown(p: Panel) -> str:
    """The panel as a markdown table with its notes."""
    head, body = table(p)
    lines = [f"# kopt peers: candidate {p.candidate_id} on {p.device}, {p.date} (run {p.run_id})", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines + [""] + [f"- {n}" for n in notes(p)]) + "\n"


def html_section(rows: list[dict], kinds: Optional[dict[int, str]] = None, device: Optional[str] = None) -> str:
    """The report's Peers section from ledger rows (the newest mode=peers run); empty text when none."""
    run = latest_rows(rows, device)
    return panel_html(build(run, kinds)) if run else ""


def panel_html(p: Panel) -> str:
    """One panel as the report's Peers section: its table and notes."""
    head, body = table(p)
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    trs = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in body)
    items = "".join(f"<li>{html.escape(n)}</li>" for n in notes(p))
    stale = (f"<p class='limiting' data-stale='{html.escape(p.candidate_id, quote=True)}'>{html.escape(p.stale)}</p>"
             if p.stale else "")
    return (f"<h2>Peers</h2>{stale}<p class='note'>candidate {html.escape(p.candidate_id)} on "
            f"{html.escape(p.device)}, {html.escape(p.date)}: cold, device-only, ABBA-paired per peer</p>"
            f"<table><tr>{th}</tr>{trs}</table><ul class='note'>{items}</ul>")


def report_section(ws: Path, device: Optional[str] = None) -> str:
    """html_section of a workspace's ledger and case table, read here (the report itself renders the panels
    its campaign already built: kopt.report.page); empty text when there is no peers run."""
    from kopt.cases import load_cases
    from kopt.paths import cases_file, ledger_file
    from kopt.store import load_dicts

    try:
        kinds = {c.id: c.kind for c in load_cases(cases_file(ws))}
    except Exception:  # a broken case file is the cases section's to report
        kinds = {}
    return html_section(load_dicts(ledger_file(ws)).rows, kinds, device)


CSV_COLUMNS = ["device", "date", "commit", "candidate_id", "run_id", "case", "kind", "variant", "peer", "ref", "state",
               "reason", "runtime_ms", "peer_ms", "speedup", "speedup_ci_lo", "speedup_ci_hi", "best", "peer_noisy",
               "runtime_eager_ms", "peer_eager_ms", "method", "flush", "status"]


def csv_text(p: Panel, header: bool = True) -> str:
    """One CSV line per case and peer; NA where there is no figure."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    if header:
        w.writerow(CSV_COLUMNS)
    for r in p.rows:
        best = r.best
        for n in p.peers:
            c = r.cells.get(n) or Cell(n, "NA", na="not run")
            t = (c.row.get("ref_timing") or {})
            state = "ok" if c.usable else "wrong" if (c.na or "").startswith("wrong") else "NA"
            ci = c.ci or (None, None)
            w.writerow([p.device, p.date, p.commit, p.candidate_id, p.run_id, r.case, r.kind,
                        r.variant, n, c.ref, state, c.na or "", fmt_na(c.cand_ms, "{:.6f}"), fmt_na(c.ms, "{:.6f}"),
                        fmt_na(c.speedup), fmt_na(ci[0]), fmt_na(ci[1]), int(best is c),
                        "NA" if c.noisy is None else int(bool(c.noisy)), fmt_na(c.cand_eager_ms, "{:.6f}"),
                        fmt_na(c.eager_ms, "{:.6f}"), t.get("method") or "NA",
                        t.get("flush_kind") or "NA", r.status])
    return buf.getvalue()


def plot(p: Panel, path: Path, finish: Optional[Callable] = None) -> Path:
    """Grouped bars: per case, the candidate's speedup over each peer (95% CI); NA peers leave a gap.
    finish(fig, path): saves the figure instead (kopt plot stamps its figures with what they show)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(8, 0.7 * len(p.rows) + 3), 4.5))
    shown = [n for n in p.peers if p.geomean_peer(n)[1]]  # NA everywhere: no bars, no legend entry
    w = 0.8 / max(len(shown), 1)
    for i, n in enumerate(shown):
        xs, ys, err = [], [], [[], []]
        for j, r in enumerate(p.rows):
            c = r.cells.get(n)
            if c and c.usable:
                xs.append(j - 0.4 + w * (i + 0.5))
                ys.append(c.speedup)
                err[0].append(max(0.0, c.speedup - c.ci[0]) if c.ci else 0.0)
                err[1].append(max(0.0, c.ci[1] - c.speedup) if c.ci else 0.0)
        ax.bar(xs, ys, w, yerr=err, capsize=2, label=n)
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_xticks(range(len(p.rows)), [str(r.case) for r in p.rows])
    ax.set_xlim(-0.5, len(p.rows) - 0.5)
    ax.set_xlabel("case")
    ax.set_ylabel("candidate speedup over the peer (95% CI)")
    gm, n = p.geomean_best()
    title = f"peers on {p.device}: geomean over the best peer per case {_x(gm)} ({n} cases)"
    if p.stale:  # said where the figure is seen, not only in its stamp
        title = (f"STALE: timed candidate {p.candidate_id} on {p.date}" + (f", {p.stale_age}" if p.stale_age else "")
                 + f"\n{title}")
    ax.set_title(title, color="firebrick" if p.stale else "black")
    if shown:
        ax.legend(fontsize=8)
    if finish is not None:
        return finish(fig, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)
    plt.close(fig)
    return path


def write_results(rows: list, cases: list, ws: Path, out: Optional[Path] = None) -> list[Path]:
    """The files of a `kopt peers` run (CaseResult rows of its cases): results/<backend>/peers-<device>-<date>.csv
    (appended: the run id tells runs apart), the panel as
    markdown beside it (this run's), and plots/peers-<device>.png; an A/B run against an earlier candidate's file
    (is_ab) writes ab-<device>-<date>.csv and .md instead, and no plot. Returns the paths written."""
    if not rows:
        return []
    dicts = [r.model_dump(mode="json") for r in rows]
    p = build(dicts, {c.id: c.kind for c in cases})
    backend = next((r.backend for r in rows if r.backend not in ("", "NA")), "tilelang")
    dev = p.slug
    ab = is_ab(dicts)  # an A/B against an earlier candidate: its own files, never the device's panel or plot
    out = Path(out) if out else ws / "results" / backend / f"{'ab' if ab else 'peers'}-{dev}-{p.date}.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    fresh = not out.is_file() or not out.read_text().startswith(",".join(CSV_COLUMNS) + "\n")
    with open(out, "w" if fresh else "a") as f:
        f.write(csv_text(p, header=fresh))
    md = out.with_suffix(".md")
    md.write_text(markdown(p))
    if ab:
        return [out, md]
    png = plot(p, ws / "results" / backend / "plots" / f"peers-{dev}.png")
    return [out, md, png]
