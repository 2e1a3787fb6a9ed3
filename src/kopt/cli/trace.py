"""`kopt trace summarize FILE`: per-kernel totals, launch gaps and tail effect of a chrome trace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(help="Read timeline traces (kineto chrome traces, mcTracer JSON).", no_args_is_help=True)


@app.command("summarize")
def summarize(
    file: Path = typer.Argument(..., help="Chrome-trace JSON (.json or .json.gz): torch.profiler or mcTracer."),
    top: int = typer.Option(10, "--top", min=1, help="Kernels to show."),
    units: Optional[int] = typer.Option(None, "--units", min=1, help="SM/AP count (default: from the trace)."),
    device_profile: Optional[str] = typer.Option(None, "--device-profile", help="Units from a hardware.yaml profile, "
                                                                                "e.g. H200, C500."),
    blocks_per_unit: Optional[int] = typer.Option(None, "--blocks-per-unit", min=1, help="Resident blocks per unit "
                                                                                         "(default: estimated)."),
    time_unit: str = typer.Option("auto", "--time-unit", help="auto | us | ns (mcTracer is assumed ns)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
) -> None:
    """Summarize a trace: count / total / mean µs / % of span per kernel, gaps per stream, tail effect."""
    from kopt.cli.common import err_console, out_console
    from kopt.errors import UsageError
    from kopt.profile.render import fmt, trace_table
    from kopt.profile.trace import summarize_file

    if device_profile and units is None:
        from kopt.hardware import profile

        p = profile(device_profile)
        if p is None:
            raise UsageError(f"unknown device profile {device_profile!r} (see kopt/data/hardware.yaml)")
        units = p.units
    s = summarize_file(file, units=units, blocks_per_unit=blocks_per_unit, time_unit=time_unit)
    if as_json:
        print(json.dumps({**s.to_dict(top=top), "call_stats": s.call_stats()}))
        return
    out = out_console()
    out.print(trace_table(s, top))
    err = err_console()
    for g in s.gaps[:4]:
        out.print(f"gaps on {g.stream}: {g.n} gaps, total {fmt(g.total_us)} µs, median {fmt(g.median_us)} µs, "
                  f"max {fmt(g.max_us)} µs", highlight=False)
    cs = s.call_stats()
    if cs:
        out.print(f"per kopt_call (median of {cs['calls']}): {fmt(cs['kernels_per_call'])} {s.event_kind}, span "
                  f"{fmt(cs['span_us'])} µs, busy {fmt(cs['busy_us'])} µs, gaps {fmt(cs['gap_pct'])}%", highlight=False)
    for n in s.notes:
        err.print(f"[dim]note: {n}[/dim]", highlight=False)
