"""Rendering of results: machine lines, JSON, or a rich table; progress on stderr."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Optional

from kopt.records import CaseResult, fmt_na, machine_line


def emit_results(run: Callable, machine: bool, as_json: bool, total: int, wall_start: float,
                 cases: Optional[list] = None, budget: Optional[float] = None,
                 command: str = "bench") -> list[CaseResult]:
    """Run `run(on_result, on_progress)`; each machine line printed (and flushed) as its case finishes, else a
    table/JSON at the end. A run stopped by `budget` (seconds) ends with a STOPPED line naming the cases not run.

    A progress bar goes to stderr for people in a terminal; otherwise a progress line per finished case goes
    to stderr when the run has several cases (stdout stays machine lines only).
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
        if not bar and total > 1:
            progress_line(command, r, len(done), total, wall_start)
        if r.message and r.status.value != "ok":
            err.print(f"[yellow]case {r.case}: {r.message}[/yellow]", highlight=False, soft_wrap=True)
        if note := replay_note(r):
            err.print(f"[yellow]case {r.case}: {note}[/yellow]", highlight=False, soft_wrap=True)

    if not machine and not as_json and not bar:
        err.print(f"[dim]evaluating {total} case(s)...[/dim]")
    if bar:
        with bar:
            results = run(on_result, on_progress)
    else:
        results = run(on_result, on_progress)
    wall = time.perf_counter() - wall_start
    not_run = list(cases[len(results):]) if cases is not None else []
    if as_json:
        print(json.dumps({"results": [r.model_dump(mode="json") for r in results],
                          "lines": [machine_line(r) for r in results],
                          "not_run": [c.id for c in not_run], "stopped": "budget" if not_run else None,
                          "overhead_s": {"wall_total": round(wall, 3)}}, indent=None))
    else:
        if not machine:
            table(results)
            err.print(f"[dim]wall time {wall:.1f} s[/dim]")
        if not_run:
            print(stopped_line(len(results), [c.id for c in not_run], budget, wall), flush=True)
    if not_run:
        print(f"kopt {command}: the budget of {budget:g} s was spent after {len(results)} of {total} case(s); "
              f"not run: {ids_text([c.id for c in not_run])} (run them with --case)", file=sys.stderr)
    sys.stdout.flush()
    return results


def ids_text(ids: list[int]) -> str:
    """Case ids as one token: comma-joined, in order, each once (NA when none)."""
    return ",".join(str(i) for i in dict.fromkeys(ids)) or "NA"


def stopped_line(ran: int, not_run: list[int], budget: Optional[float], wall: float) -> str:
    """The stdout line of a run the budget stopped: what ran, what did not."""
    return (f"STOPPED:budget BUDGET_S:{fmt_na(budget, '{:g}')} RAN:{ran} NOT_RUN:{ids_text(not_run)} "
            f"WALL_S:{wall:.1f}")


def progress_line(command: str, r: CaseResult, n: int, total: int, wall_start: float) -> None:
    """One stderr line per finished case of a long run: what finished, how far, how long so far."""
    of = f"/{total}" if total else ""
    print(f"kopt {command}: case {r.case} {r.variant} {r.status.value} ({n}{of}, "
          f"{time.perf_counter() - wall_start:.1f} s)", file=sys.stderr, flush=True)


def deadline(budget: Optional[float], wall_start: float) -> Optional[float]:
    """The perf_counter deadline of a --budget counted from the command's start (None: no budget)."""
    return None if budget is None else wall_start + budget


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
