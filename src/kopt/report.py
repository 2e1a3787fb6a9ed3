"""`kopt report`: one self-contained HTML page of the campaign (plots inlined as base64 PNG).

Sections: the cases (with the seed's C500 reference times, labelled as reference data), the best
candidate from the ledger, the trajectory, and the latest diagnosis (the newest
results/*/profiling/*/*/summary.json). Nothing is fetched from the network; every value is escaped.
"""

from __future__ import annotations

import base64
import html
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:13px}td,th{border:1px solid #ccc;padding:3px 7px;
text-align:right}th{background:#f3f3f3}td.l,th.l{text-align:left}.ok{color:#080}.watch{color:#b60}
.limiting{color:#c00;font-weight:bold}.NA{color:#999}.note{color:#666;font-size:12px}img{max-width:100%}"""


def _e(v) -> str:
    if v is None:
        return "NA"
    if isinstance(v, float):
        return html.escape(f"{v:.4g}")
    return html.escape(str(v))


def _table(head: list[str], rows: list[list], left: int = 0) -> str:
    th = "".join(f"<th class='{'l' if i < left else ''}'>{_e(h)}</th>" for i, h in enumerate(head))
    body = "".join("<tr>" + "".join(f"<td class='{'l' if i < left else ''}'>{c}</td>" for i, c in enumerate(r))
                   + "</tr>" for r in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def latest_summary(ws: Path) -> Optional[Path]:
    """The newest results/*/profiling/*/*/summary.json (by its `created` stamp, then mtime)."""
    import json

    best, key = None, None
    for p in (ws / "results").glob("*/profiling/*/*/summary.json"):
        try:
            created = json.loads(p.read_text()).get("created", "")
        except (OSError, ValueError):
            continue
        k = (created, p.stat().st_mtime)
        if key is None or k > key:
            best, key = p, k
    return best


def _cases_section(c, ws: Path) -> str:
    from kopt.cases import load_cases
    from kopt.paths import cases_file

    by_case = {}
    for r in c.rows:
        by_case.setdefault(r.case, r)
    rows = []
    for x in load_cases(cases_file(ws)):
        r = by_case.get(x.id)
        ci = f"{r.ci[0]:.3f}-{r.ci[1]:.3f}" if r and r.ci else "NA"
        st = (f"<span class='{'ok' if r.correct else 'limiting'}'>{_e(r.status)}</span>") if r else "NA"
        rows.append([_e(x.id), _e(x.kind), _e(x.batch), _e(x.seqlen_k), _e(x.kv_heads), _e(x.gqa),
                     _e(x.c500_ref_ms), _e(r.runtime_ms if r else None), _e(r.ref_runtime_ms if r else None),
                     _e(r.speedup if r else None), ci, _e(r.gbps if r else None), _e(r.pct_peak if r else None), st])
    head = ["case", "kind", "batch", "seqlen_k", "kv_heads", "gqa", "C500 ref ms*", "runtime ms", "baseline ms",
            "speedup", "95% CI", "GB/s", "% ceiling", "status"]
    return ("<h2>Cases</h2>" + _table(head, rows, 2) +
            "<p class='note'>* C500 ref ms: the seed's MetaX C500 baseline times, reference data from another "
            "device; never compared as a measurement.</p>")


def _best_section(c) -> str:
    if not c.best_id:
        return "<h2>Best candidate</h2><p>No candidate rows in candidates.jsonl yet.</p>"
    b = c.best
    rows = [[_e(k), _e(b.get(k))] for k in ("candidate_id", "geomean", "n_cases", "n_incorrect", "basis",
                                           "parent_id", "technique")]
    return "<h2>Best candidate</h2>" + _table(["field", "value"], rows, 2)


def _trajectory_section(c, img: str) -> str:
    rows = [[_e(p.iteration), _e(p.candidate_id), _e(p.geomean),
             f"<span class='{'ok' if p.outcome == 'improved' else 'watch' if p.outcome == 'not improved' else 'limiting'}'>"
             f"{_e(p.outcome)}</span>"] for p in c.trajectory]
    return (f"<h2>Trajectory</h2><p class='note'>source: {_e(c.trajectory_source)}</p>{img}" +
            (_table(["iteration", "candidate", "geomean", "outcome"], rows, 2) if rows else "<p>No iterations yet.</p>"))


def _diagnosis_section(ws: Path) -> str:
    from kopt.profile.diagnosis import pattern_titles
    from kopt.profile.models import ProfileSummary

    p = latest_summary(ws)
    if p is None:
        return "<h2>Latest diagnosis</h2><p>No profile yet: run <code>kopt profile --case N</code>.</p>"
    try:
        s = ProfileSummary.model_validate_json(p.read_text())
    except ValueError as e:
        return f"<h2>Latest diagnosis</h2><p>Unreadable {_e(p.name)}: {_e(str(e)[:200])}</p>"
    titles = pattern_titles()
    rows = [[_e(d.title), f"<span class='{d.score.value}'>{_e(d.score.value)}</span>",
             _e(", ".join(f"{k}={v}" for k, v in list(d.evidence.items())[:6])), _e(d.reason),
             _e(", ".join(f"{x} ({titles[x]})" if x in titles else x for x in d.patterns) or "-")]
            for d in s.diagnosis.dimensions]
    notes = "".join(f"<li>{_e(n)}</li>" for n in s.notes)
    return (f"<h2>Latest diagnosis</h2><p>case {_e(s.case)} ({_e(s.variant)}), candidate {_e(s.candidate_id)}, "
            f"tool {_e(s.tool.value)} on {_e(s.device_name)}, {_e(s.created)}; kernel "
            f"<code>{_e(s.diagnosis.kernel)}</code>; folder <code>{_e(s.out_dir)}</code></p>"
            + _table(["dimension", "score", "evidence", "reason", "patterns"], rows, 5)
            + (f"<ul class='note'>{notes}</ul>" if notes else ""))


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f"<p><img alt='{html.escape(alt)}' src='data:image/png;base64,{data}'></p>"


def build(ws: Path, out: Optional[Path] = None, device: Optional[str] = None) -> Path:
    """Write the HTML report (default results/<backend>/report.html); returns its path."""
    from kopt import peers_panel
    from kopt.plot import load_campaign, make_plots

    c = load_campaign(ws, device)
    with tempfile.TemporaryDirectory() as tmp:
        sp, bw, tr = make_plots(ws, Path(tmp), campaign=c)
        imgs = {"speedup": _img(sp, "per-case speedup"), "bandwidth": _img(bw, "achieved bandwidth"),
                "trajectory": _img(tr, "trajectory")}
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    body = (f"<h1>kopt campaign report</h1><p class='note'>workspace {_e(ws.name)}, device {_e(device or 'all')}, "
            f"generated {_e(now)}; ledger "
            f"lines skipped as unreadable: {c.skipped}</p>" + _cases_section(c, ws) + imgs["speedup"] +
            imgs["bandwidth"] + peers_panel.report_section(ws, device) + _best_section(c) +
            _trajectory_section(c, imgs["trajectory"]) + _diagnosis_section(ws))
    doc = (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>kopt report</title>"
           f"<style>{_CSS}</style></head><body>{body}</body></html>\n")
    out = Path(out) if out else ws / "results" / c.backend / "report.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(doc)
    return out
