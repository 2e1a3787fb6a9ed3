"""Rendering of profiles and trace summaries: summary.md, rich tables (rich imported lazily)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from kopt.profile.models import Diagnosis, ProfileSummary, config_text

_STYLE = {"ok": "green", "watch": "yellow", "limiting": "bold red", "NA": "dim"}


def fmt(v) -> str:
    """Numbers compactly, None as NA."""
    if v is None:
        return "NA"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1e4 else f"{v:,.0f}"
    return str(v)


def _evidence(ev: dict, limit: int = 6) -> str:
    return ", ".join(f"{k}={fmt(v)}" for k, v in list(ev.items())[:limit])


def _patterns(letters: list[str], titles: dict[str, str]) -> str:
    return ", ".join(f"{x} ({titles[x]})" if x in titles else x for x in letters) or "-"


def diagnosis_markdown(d: Diagnosis, titles: Optional[dict] = None) -> str:
    """The six dimensions as a markdown table."""
    titles = titles or {}
    rows = ["| dimension | score | evidence | reason | patterns |", "|---|---|---|---|---|"]
    for x in d.dimensions:
        reason = x.reason.replace("|", "/")
        rows.append(f"| {x.title} | **{x.score.value}** | {_evidence(x.evidence).replace('|', '/')} | {reason} | "
                    f"{_patterns(x.patterns, titles)} |")
    return "\n".join(rows)


def summary_markdown(s: ProfileSummary, titles: Optional[dict] = None) -> str:
    """summary.md: what ran, the diagnosis, the kernels, the files, the notes."""
    lines = [f"# Profile: case {s.case} ({s.variant})", "",
             f"- candidate: `{s.candidate_path}` (id {s.candidate_id}, backend {s.backend})",
             f"- config: {config_text(s.config) or 'its own plan'}",
             f"- tool: {s.tool.value} (asked: {s.requested_tool}); device: {s.device} ({s.device_name})",
             f"- created: {s.created}; diagnosis from: {s.diagnosis.source}",
             f"- dominant kernel: `{s.diagnosis.kernel or 'NA'}`; units: {fmt(s.diagnosis.units)} "
             f"{s.diagnosis.unit_name}",
             f"- bytes a call must move: {fmt(s.ideal_bytes)}; copy ceiling: {fmt(s.copy_ceiling_gbps)} GB/s", "",
             "## Diagnosis", "", diagnosis_markdown(s.diagnosis, titles), ""]
    lim = s.diagnosis.limiting()
    if lim:
        lines += ["Limiting: " + "; ".join(f"{d.title} -> {', '.join(d.patterns) or '-'}" for d in lim), ""]
    if s.kernels:
        lines += ["## Kernels", "", "| kernel | duration µs | grid | block | regs | dram % | occupancy % |",
                  "|---|---|---|---|---|---|---|"]
        for k in s.kernels[:10]:
            m = k.metrics
            dur = m.get("duration_ns")
            lines.append(f"| `{k.name[:70]}` | {fmt(dur / 1e3 if dur else None)} | {fmt(m.get('grid_size'))} | "
                         f"{fmt(m.get('block_size'))} | {fmt(m.get('registers_per_thread'))} | "
                         f"{fmt(m.get('dram_pct'))} "
                         f"| {fmt(m.get('achieved_occupancy_pct'))} |")
        missing = sorted({n for k in s.kernels for n in k.missing})
        if missing:
            lines += ["", "NA metrics: " + ", ".join(f"{n} ({s.kernels[0].missing.get(n, 'NA')})"
                                                    for n in missing[:8]) + (" ..." if len(missing) > 8 else "")]
        lines.append("")
    if s.hot:
        lines += ["## Hot instructions (sampled warp stalls)", "",
                  "| kernel | offset | SASS | samples | % of kernel | leading stalls | waits on |",
                  "|---|---:|---|---:|---:|---|---|"]
        for h in s.hot:
            stalls = ", ".join(f"{k} {v}" for k, v in list(h.stalls.items())[:3]) or "-"
            wait = f"`{h.waits_on.replace('|', '/')}`" if h.waits_on else "-"
            lines.append(f"| `{h.kernel[:40]}` | 0x{h.offset:04x} | `{h.sass.replace('|', '/')}` | {h.samples} | "
                         f"{h.share_pct:.1f} | {stalls} | {wait} |")
        lines.append("")
    if s.timeline:
        t = s.timeline
        lines += ["## Timeline", "", f"{t['event_kind']}: {t['n_events']} events, span {fmt(t['span_us'])} µs, "
                  f"busy {fmt(t['busy_us'])} µs ({t['format']}, {t['time_unit']})", ""]
    lines += ["## Files", ""] + [f"- `{f}`" for f in s.files] + [""]
    if s.notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in s.notes] + [""]
    return "\n".join(lines)


def write_summary(s: ProfileSummary, out: Path) -> None:
    """summary.json and summary.md into the run folder."""
    from kopt.profile.diagnosis import pattern_titles

    s.files = list(dict.fromkeys(s.files + ["summary.json", "summary.md"]))
    (out / "summary.json").write_text(s.model_dump_json(indent=2) + "\n")
    (out / "summary.md").write_text(summary_markdown(s, pattern_titles()))


def diagnosis_table(d: Diagnosis, titles: Optional[dict] = None, title: str = "kopt profile: diagnosis"):
    """A rich Table of the six dimensions."""
    from rich.table import Table

    titles = titles or {}
    t = Table(title=title, show_lines=False)
    t.add_column("dimension", overflow="fold", min_width=10)
    t.add_column("score", no_wrap=True)
    for col in ("evidence", "reason", "patterns"):
        t.add_column(col, overflow="fold")
    for x in d.dimensions:
        st = _STYLE.get(x.score.value, "")
        t.add_row(x.title, f"[{st}]{x.score.value}[/{st}]", _evidence(x.evidence, 5), x.reason,
                  _patterns(x.patterns, titles))
    return t


def hot_table(hot, top: int = 8):
    """A rich Table of the most sampled SASS instructions (kopt profile --source)."""
    from rich.table import Table

    t = Table(title=f"top {min(top, len(hot))} sampled instructions (summary.md has {len(hot)})")
    for col in ("kernel", "offset", "SASS", "samples", "%", "stalls", "waits on"):
        t.add_column(col, overflow="fold")
    for h in hot[:top]:
        t.add_row(h.kernel[:32], f"0x{h.offset:04x}", h.sass, str(h.samples), f"{h.share_pct:.1f}",
                  ", ".join(f"{k} {v}" for k, v in list(h.stalls.items())[:2]) or "-", h.waits_on or "-")
    return t


def trace_table(s, top: int = 10):
    """A rich Table of the top kernels of a trace summary."""
    from rich.table import Table

    t = Table(title=f"top {top} {s.event_kind} ({s.format}, span {fmt(s.span_us)} µs)")
    width = min(40, max((len(r.name) for r in s.kernels[:top]), default=4))
    t.add_column("name", no_wrap=True, overflow="ellipsis", min_width=width)
    for col in ("count", "total µs", "mean µs", "% span", "grid", "waves", "idle slots %"):
        t.add_column(col, overflow="fold")
    for r in s.kernels[:top]:
        tail = r.tail or {}
        t.add_row(r.name[:80], str(r.count), fmt(r.total_us), fmt(r.mean_us), fmt(r.pct_span),
                  fmt(r.grid), fmt(tail.get("waves")), fmt(tail.get("idle_slot_pct")))
    return t
