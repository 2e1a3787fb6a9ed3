"""`kopt report`: one self-contained HTML page of the campaign (plots inlined as base64 PNG).

Sections: the shown candidate (kopt.policy.shown) and the rule's best beside it, every case of the matrix
(with the seed's C500 reference times, labelled as reference data), the plots, peers, the
trajectory and the latest diagnosis (the newest results/*/profiling/*/*/summary.json).

Nothing is fetched from the network; every value is escaped. Measured cells carry class `m`, NA
cells class `NA` with the reason in `data-why` (and in the row's notes); `<meta name="kopt-…">`
tags name the candidate and the number of cases, and a small script marks every image loaded or
failed (`data-state`, `body[data-images]`) for the browser check. No wall-clock time is written:
the same data gives the same file.
"""

from __future__ import annotations

import base64
import html
import json
import tempfile
from pathlib import Path
from typing import Optional

_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:13px}td,th{border:1px solid #ccc;padding:3px 7px;
text-align:right}th{background:#f3f3f3}td.l,th.l{text-align:left}.ok{color:#080}.watch{color:#b60}
.limiting{color:#c00;font-weight:bold}td.NA,.NA{color:#999}.note{color:#666;font-size:12px}
td.m{white-space:nowrap}td.notes{max-width:420px;font-size:11px;color:#555;text-align:left}img{max-width:100%}
.box{background:#f7f7f2;border:1px solid #ddd;padding:.6em 1em}"""
_SCRIPT = ("window.addEventListener('load',function(){var im=document.images,ok=0;for(var i=0;i<im.length;i++)"
           "{var g=im[i].complete&&im[i].naturalWidth>0;im[i].setAttribute('data-state',g?'loaded':'failed');"
           "ok+=g?1:0;}document.body.setAttribute('data-images',ok+'/'+im.length);"
           "document.body.setAttribute('data-height',document.documentElement.scrollHeight);});")
#: (CaseRow field, header, format) of the measured columns of the case table.
MEASURED = (("runtime_ms", "runtime ms", "{:.4f}"), ("ref_runtime_ms", "baseline ms", "{:.4f}"),
            ("speedup", "speedup", "{:.3f}"), ("ci", "95% CI", None), ("gbps", "GB/s", "{:.0f}"),
            ("pct_peak", "% ceiling†", "{:.1f}"), ("pct_limit", "% limit", "{:.1f}"))


def _e(v) -> str:
    if v is None:
        return "NA"
    if isinstance(v, float):
        return html.escape(f"{v:.4g}")
    return html.escape(str(v))


def _table(head: list[str], rows: list[list], left: int = 0, row_attrs: Optional[list[str]] = None) -> str:
    th = "".join(f"<th class='{'l' if i < left else ''}'>{_e(h)}</th>" for i, h in enumerate(head))
    body = "".join(f"<tr{(' ' + row_attrs[k]) if row_attrs else ''}>"
                   + "".join(c if c.startswith("<td") else f"<td class='{'l' if i < left else ''}'>{c}</td>"
                             for i, c in enumerate(r)) + "</tr>" for k, r in enumerate(rows))
    return f"<table><tr>{th}</tr>{body}</table>"


def _cell(name: str, value, fmt: Optional[str], why: Optional[str], foot: dict) -> str:
    """A measured cell (class m, its number) or an NA cell (class NA, the reason in data-why and as a
    numbered footnote under the table)."""
    if value is None:
        why = why or "not measured"
        n = foot.setdefault(why, len(foot) + 1)
        return (f"<td class='NA' data-f='{name}' data-why='{html.escape(why, quote=True)}'>NA<sup>{n}</sup></td>")
    text = f"{value[0]:.3f}–{value[1]:.3f}" if name == "ci" else fmt.format(value)
    return f"<td class='m' data-f='{name}'>{html.escape(text)}</td>"


def latest_summary(ws: Path) -> Optional[Path]:
    """The newest results/*/profiling/*/*/summary.json (by its `created` stamp, then mtime) of a candidate's own
    plan; a profile of a variant (`kopt profile --config`) only when there is no other."""
    best, key = None, None
    for p in (ws / "results").glob("*/profiling/*/*/summary.json"):
        try:
            d = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        k = (d.get("config") is None, d.get("created", ""), p.stat().st_mtime)
        if key is None or k > key:
            best, key = p, k
    return best


def _cases_section(c) -> str:
    rows, attrs, foot = [], [], {}
    for r in c.rows:
        notes = [r.note] if r.basis and r.note else []
        if r.noisy:
            notes.append(f"noisy timing: {r.noisy}")
        st = (f"<span class='{'ok' if r.correct and r.status == 'ok' else 'limiting'}'>{_e(r.status)}</span>"
              if r.basis else "NA")
        cells = [_e(r.case), _e(r.kind), _e(r.batch), _e(r.seqlen_k), _e(r.valid_keys), _e(r.kv_heads), _e(r.gqa),
                 _e(r.c500_ref_ms), _e(r.basis)]
        cells += [_cell(k, getattr(r, k), fmt, r.na.get(k), foot) for k, _, fmt in MEASURED]
        cells += [st, f"<td class='notes'>{'; '.join(html.escape(n) for n in notes) or '-'}</td>"]
        rows.append(cells)
        attrs.append(f"class='case' data-case='{r.case}' data-basis='{r.basis or 'none'}'")
    head = ["case", "kind", "batch", "seqlen_k", "valid keys", "kv_heads", "gqa", "C500 ref ms*", "source"]
    head += [h for _, h, _ in MEASURED] + ["status", "notes"]
    copy = sorted(r.case for r in c.rows if r.pct_peak is not None and r.ceiling == "copy")
    from kopt.policy.shown import ranges

    notes = "".join(f"<li value='{n}'>{html.escape(why)}</li>" for why, n in foot.items())
    return ("<h2>Cases</h2>" + _table(head, rows, 2, attrs)
            + (f"<ol class='note'>{notes}</ol>" if notes else "")
            + "<p class='note'>* C500 ref ms: the seed's MetaX C500 baseline times, reference data from another "
            "device; never compared as a measurement. † % ceiling: GB/s as % of the measured read ceiling"
            + (f"; for case {ranges(copy)} (rows before the read ceiling was recorded) of the measured copy ceiling"
               if copy else "") + ". % limit: the roofline limit max(bytes / read ceiling, launch floor) / RUNTIME. "
            "source: the shown candidate's verdict row, else its latest bench row on the verdict's device.</p>")


def _heldout_section(c) -> str:
    """The shown candidate's verdict by group, and its held-out draws one row each (the number to move)."""
    from kopt.policy import ranking
    from kopt.records import fmt_na

    s = c.shown
    run = s.verdict_run if s else None
    rows = [r for r in c.ledger.rows if run and r.get("run_id") == run and r.get("mode") == "verdict"]
    held = [r for r in rows if ranking.group_of(r) == "heldout"]
    head = "<h2>Held-out draws</h2>"
    if not held:
        return head + ("<p>The shown verdict has no held-out rows (verdicts before the workload library, or "
                       "<code>--heldout 0</code>): run <code>kopt verify</code>.</p>")
    g = ranking.geomeans(rows)
    theirs = ranking.reigning_rows(c.ledger.rows, run)
    vs = ranking.heldout_ratio(held, theirs)
    x = lambda v: fmt_na(v, "{:.3f}x")  # noqa: E731
    p = lambda v: fmt_na(v, "{:.1f}")  # noqa: E731
    groups = [["uniform", x(g.uniform), p(g.pct_limit)], ["ragged", x(g.ragged), p(g.pct_limit_ragged)],
              ["seed", x(g.seed), p(g.pct_limit_seed)], ["held-out", x(g.heldout), p(g.pct_limit_heldout)]]
    body = [[_e(r.get("case")), _e(r.get("model")), _e(r.get("shape")), _e(r.get("variant")),
             _e(ranking.row_plan_class(r, c.floor_ms)), _e(fmt_na(r.get("runtime_ms"))),
             _e(fmt_na(r.get("ref_runtime_ms"))), _e(fmt_na(ranking.row_speedup(r), "{:.3f}x")),
             _e(fmt_na(r.get("pct_limit"), "{:.1f}")), _e(fmt_na(r.get("compile_s"), "{:.1f}")), _e(r.get("status"))]
            for r in held]
    classes = [[_e(k.plan), _e(k.n), _e(p(k.pct_limit)),
                _e(f"{k.lowest['case']} (seed {k.lowest['heldout_seed']}): {p(k.lowest['pct_limit'])}"),
                _e(p(k.heldout_at_limit))] for k in ranking.heldout_by_plan(held, c.floor_ms)]
    seed = held[0].get("heldout_seed")
    pair = (f" Against the reigning candidate <code>{_e(ranking.row_cid(theirs[0]))}</code> timed on the same draws: "
            f"{_e(x(vs))} (above 1: this candidate is faster where it will be deployed)." if theirs else
            " The reigning candidate was not timed on these draws.")
    return (head + f"<p>Verdict {_e(run)}, draw seed {_e(seed)} (<code>kopt verify --heldout-seed {_e(seed)}</code> "
            "draws the same shapes): the named cases are a sample; the held-out geomean is the number to move."
            + pair + "</p>" + _table(["group", "geomean speedup", "geomean % limit"], groups, 1)
            + "<h3>Where the held-out geomean is lost</h3>"
            + _table(["plan", "draws", "geomean % limit", "lowest draw, % limit",
                      "all draws' geomean % limit, this plan's at the limit"], classes, 1)
            + "<p class='note'>plan: the kernel the draw ran (floor: its limit is the launch floor). The last column "
            "is what closing that plan's gap alone would give the held-out geomean.</p>"
            + _table(["case", "model", "shape", "variant", "plan", "runtime ms", "ref ms", "speedup", "% limit",
                      "compile s", "status"], body, 5))


def _e2e_section(c) -> str:
    """The newest `kopt e2e` line (the candidate inside a decoder's loop), or how to get one."""
    from kopt.e2e.models import latest_line

    line = latest_line(c.ledger.rows)
    return "<h2>End to end</h2>" + (f"<p><code data-e2e='1'>{_e(line)}</code></p>" if line else
                                    "<p class='note'>No e2e rows yet: <code>kopt e2e --model NAME</code> runs the "
                                    "candidate as a decoder's attention.</p>")


def _shown_section(c, ranked: list[dict]) -> str:
    s = c.shown
    if not s or not s.candidate_id:
        return "<h2>Shown candidate</h2><p>No candidate rows in candidates.jsonl yet.</p>"
    from kopt.paths import CANDIDATE_REL

    where = f"({CANDIDATE_REL})" if s.source == "shipped" else "(no shipped solution in the workspace)"
    out = (f"<h2>Shown candidate</h2><div class='box'><p data-headline='1'><b>{_e(s.headline())}</b></p>"
           f"<p>{_e(s.source)} candidate <code>{_e(s.candidate_id)}</code> {_e(where)} {_e(s.detail())}; measured at "
           f"commit {_e(', '.join(s.commits) or 'NA')}.</p>")
    if b := s.best_by_rule:
        out += (f"<p><b>Best by the improvement rule: <code>{_e(b.candidate_id)}</code></b> (iteration "
                f"{_e(b.iteration)}, geomean {_e(b.geomean)}): {_e(b.reason)}.</p>")
    else:
        out += "<p>Best by the improvement rule: the same candidate.</p>"
    out += ("<p class='note'>Rule (kopt.policy.shown): the shipped candidate with its latest verdict, its latest bench "
            "rows for cases the verdict did not time; the rule's best beside it only when it is another "
            "candidate.</p></div>")
    if ranked:
        mark = {s.candidate_id: s.source, **({s.best_by_rule.candidate_id: "best by rule"} if s.best_by_rule else {})}
        rows = [[_e(r["rank"]), _e(r["candidate_id"]), _e(mark.get(r["candidate_id"], "")), _e(r["geomean"]),
                 _e(r["n_cases"]), _e(r["n_incorrect"]), _e(r["basis"]), _e(r["technique"])] for r in ranked]
        out += ("<h3>Ranking (kopt candidates, top 5)</h3>"
                + _table(["#", "candidate", "shown as", "geomean", "cases", "bad", "basis", "technique"], rows, 3))
    return out


def _peers_section(c, imgs: dict) -> str:
    from kopt.report import panel

    if not c.peers:
        return ("<h2>Peers</h2><p class='note'>No peer rows yet: <code>kopt peers</code> times other decode "
                "kernels on the same cases; its panel appears here.</p>")
    return "".join(panel.panel_html(p) + imgs.get(f"peers-{dev}", "") for dev, p in c.peers.items())


def _trajectory_section(c, img: str) -> str:
    cls = {"improved": "ok", "not improved": "watch", "overfit": "watch", "not judged": "na"}
    rows = [[_e(p.iteration), _e(p.candidate_id), _e(p.geomean), _e(p.ragged), _e(p.device),
             f"<span class='{cls.get(p.outcome, 'limiting')}'>{_e(p.outcome)}</span>"] for p in c.trajectory]
    return (f"<h2>Trajectory</h2><p class='note'>source: {_e(c.trajectory_source)}; geomeans of each iteration's "
            f"verdict (uniform: the rule's figure; ragged: the ragged cases)</p>{img}"
            + (_table(["iteration", "candidate", "geomean", "ragged geomean", "device", "outcome"], rows, 2)
               if rows else "<p>No iterations yet.</p>"))


def _diagnosis_section(ws: Path, shown_id: Optional[str] = None) -> str:
    from kopt.profile.diagnosis import pattern_titles
    from kopt.profile.models import ProfileSummary, config_text

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
    stale = (f"<p class='limiting' data-stale='{_e(s.candidate_id)}'>stale: this profile is of candidate "
             f"{_e(s.candidate_id)} ({_e(str(s.created)[:10])}), not the shown candidate {_e(shown_id)}; run "
             f"<code>kopt profile --case {_e(s.case)}</code> to see the shown one</p>"
             if shown_id and s.candidate_id != shown_id else "")
    return (f"<h2>Latest diagnosis</h2>{stale}<p>case {_e(s.case)} ({_e(s.variant)}), candidate {_e(s.candidate_id)}, "
            + (f"config <code>{_e(config_text(s.config))}</code> (a variant, not the candidate's own "
               f"plan), " if s.config is not None else "")
            + f"tool {_e(s.tool.value)} on {_e(s.device_name)}, {_e(s.created)}; kernel "
            f"<code>{_e(s.diagnosis.kernel)}</code>; folder <code>{_e(s.out_dir)}</code></p>"
            + _table(["dimension", "score", "evidence", "reason", "patterns"], rows, 5)
            + (f"<ul class='note'>{notes}</ul>" if notes else ""))


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return (f"<p><img data-img='{html.escape(path.stem)}' alt='{html.escape(alt)}' "
            f"src='data:image/png;base64,{data}'></p>")


def _ranked(ws: Path, c, device: Optional[str]) -> list[dict]:
    from kopt.paths import ledger_file
    from kopt.policy import ranking

    df, _ = ranking.load_frame(ledger_file(ws), device, c.ledger)  # the ledger the campaign read
    return ranking.records(ranking.rank(df).head(5))


def build(ws: Path, out: Optional[Path] = None, device: Optional[str] = None, campaign=None,
          plots: Optional[list[Path]] = None) -> Path:
    """Write the HTML report (default results/<backend>/report.html); returns its path.
    campaign / plots: the campaign and its figures when already made (inlined, not drawn again)."""
    from kopt.report.campaign import load_campaign
    from kopt.report.plot import make_plots

    ws = Path(ws)
    c = campaign or load_campaign(ws, device)
    with tempfile.TemporaryDirectory() as tmp:
        files = {p.stem: p for p in (plots or make_plots(ws, Path(tmp), campaign=c))}
        imgs = {k: _img(p, f"{k} of {c.best_id or 'no candidate'}") for k, p in files.items()}
    newest = "; ".join(f"{d} {t}" for d, t in c.newest().items()) or "none"
    meta = "".join(f"<meta name='{k}' content='{html.escape(v, quote=True)}'>"
                   for k, v in {**c.marker(), "kopt-images": ",".join(imgs)}.items())
    body = (f"<h1>kopt campaign report</h1><p class='note'>device {_e(device or 'all')}; newest ledger row per "
            f"device: {_e(newest)}; ledger lines skipped as unreadable: {c.skipped}. "
            f"{_e(c.stamp())}.</p>" + _shown_section(c, _ranked(ws, c, device)) + _cases_section(c)
            + _heldout_section(c) + _e2e_section(c)
            + imgs["speedup"] + imgs["roofline"] + _peers_section(c, imgs)
            + _trajectory_section(c, imgs["trajectory"]) + _diagnosis_section(ws, c.best_id))
    doc = (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>{meta}<title>kopt report</title>"
           f"<style>{_CSS}</style></head><body>{body}<script>{_SCRIPT}</script></body></html>\n")
    out = Path(out) if out else ws / "results" / c.backend / "report.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(doc)
    return out


def refresh(ws: Path) -> list[Path]:
    """Regenerate the committed views from the workspace's data: the plots, report.html and results/STATUS.md (the
    report's PNG screenshot, `kopt report --screenshot`, is for looking at and is not committed: .gitignore).
    Returns the files written."""
    from kopt.report import status_md
    from kopt.report.campaign import load_campaign
    from kopt.report.plot import make_plots

    ws = Path(ws)
    c = load_campaign(ws)
    plots = make_plots(ws, campaign=c)
    return plots + [build(ws, campaign=c, plots=plots), status_md.write(ws, campaign=c)]


def refresh_for_commit(ws: Path) -> tuple[list[Path], Optional[str]]:
    """`refresh` for `kopt commit`: (files written, None), or ([], why) when it failed. A failure is
    reported, not fatal: an iteration's kernel and rows matter more than its figures."""
    try:
        return refresh(ws), None
    except Exception as e:  # matplotlib, a malformed case file: the commit goes ahead
        return [], f"plots and report not regenerated: {type(e).__name__}: {str(e)[:200]}"
