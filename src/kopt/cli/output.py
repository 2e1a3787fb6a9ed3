"""Rendering of results: machine lines, JSON, or a rich table; progress on stderr."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

from kopt.records import CaseResult, fmt_na, machine_line


def emit_results(run: Callable, machine: bool, as_json: bool, total: int, wall_start: float) -> list[CaseResult]:
    """Run `run(on_result, on_progress)`; machine lines as results come, else a table/JSON at the end.

    A progress bar goes to stderr for people (never in --machine or --json mode).
    """
    from kopt.cli.common import err_console

    err = err_console()
    done = []
    bar = None
    if not (machine or as_json) and err.is_terminal:  # rich.progress only when a bar is drawn
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        bar = Progress(TextColumn("evaluating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err,
                       transient=True)
    task = bar.add_task("cases", total=total) if bar else None

    def on_progress(n: int) -> None:
        if bar:
            bar.update(task, completed=n)

    def on_result(r: CaseResult) -> None:
        if not done and r.static_warnings:
            err.print(f"[yellow]static check: {len(r.static_warnings)} warning(s)[/yellow]", highlight=False)
            for w in r.static_warnings:
                err.print(f"[yellow]  {w}[/yellow]", highlight=False, soft_wrap=True)
        done.append(r)
        if machine:
            print(machine_line(r), flush=True)
        else:
            err.print(f"[dim]case {r.case}: {r.status.value} ({len(done)}/{total})[/dim]")
        if r.message and r.status.value != "ok":
            err.print(f"[yellow]case {r.case}: {r.message}[/yellow]", highlight=False)
        if note := replay_note(r):
            err.print(f"[yellow]case {r.case}: {note}[/yellow]", highlight=False)

    if not machine and not as_json and not bar:
        err.print(f"[dim]evaluating {total} case(s)...[/dim]")
    if bar:
        with bar:
            results = run(on_result, on_progress)
    else:
        results = run(on_result, on_progress)
    wall = time.perf_counter() - wall_start
    if as_json:
        print(json.dumps({"results": [r.model_dump(mode="json") for r in results],
                          "lines": [machine_line(r) for r in results],
                          "overhead_s": {"wall_total": round(wall, 3)}}, indent=None))
    elif not machine:
        table(results)
        err.print(f"[dim]wall time {wall:.1f} s[/dim]")
    sys.stdout.flush()
    return results


def replay_note(r: CaseResult) -> str:
    """Why a case's device-only calls ran on the stream although graph replays were asked for ("" else)."""
    t = r.timing
    if t is None or t.replay != "stream" or not t.replay_note:
        return ""
    return f"timed on the stream, not as graph replays: {t.replay_note}"


def table(results: list[CaseResult]) -> None:
    """A rich table of results with the C500 reference column beside measured numbers."""
    from rich.table import Table

    from kopt.cli.common import out_console

    t = Table(title="kopt bench")
    for col in ("case", "variant", "status", "runtime ms", "ref ms", "speedup", "CI", "GB/s", "%peak", "% limit", "ref",
                "device"):
        t.add_column(col)
    for r in results:
        ci = f"{r.speedup_ci[0]:.3f}-{r.speedup_ci[1]:.3f}" if r.speedup_ci else "NA"
        style = "green" if r.correct else "red"
        t.add_row(str(r.case), r.variant, f"[{style}]{r.status.value}[/{style}]", fmt_na(r.runtime_ms),
                  fmt_na(r.ref_runtime_ms), fmt_na(r.speedup, "{:.3f}x"), ci, fmt_na(r.gbps, "{:.0f}"),
                  fmt_na(r.pct_peak, "{:.1f}"), fmt_na(r.pct_limit, "{:.1f}"), r.ref, r.device)
    out_console().print(t)
