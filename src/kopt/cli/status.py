"""`kopt status`: iterations, best per case and overall, recent outcomes, stagnation protocol."""

from __future__ import annotations

import json
from typing import Optional

import typer


def _x(v) -> str:
    from kopt.records import SPEEDUP_FMT, fmt_na

    return fmt_na(v, SPEEDUP_FMT)


def _pct(v) -> str:
    from kopt.records import fmt_na

    return fmt_na(v, "{:.1f}")


def command(
    last: int = typer.Option(5, "--last", min=0, help="How many recent iterations to list."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    no_record: bool = typer.Option(False, "--no-record", help="Write nothing. Without it, status appends one "
                                                              "stagnation row to candidates.jsonl per stagnation "
                                                              "episode (after 3 non-improving iterations)."),
    device: Optional[str] = typer.Option(None, "--device", help="Rank and list best-per-case rows of one device only."),
) -> None:
    """Where the loop stands: the shipped candidate, the rule's best, the worst case; after 3 non-improving
    iterations the re-profile protocol (recorded once in candidates.jsonl unless --no-record)."""
    from kopt.cli.common import out_console
    from kopt.paths import workspace
    from kopt.workspace import status

    rep = status.status(workspace(), last=last, record=not no_record, device=device)
    if as_json:
        print(json.dumps(rep.to_dict(), indent=2))
        return
    from rich.table import Table

    con = out_console()
    from kopt.policy import Shown

    shown = Shown.model_validate(rep.shown)
    lines = shown.lines()
    con.print(lines[0], highlight=False, soft_wrap=True)  # the headline: shipped, the rule's best, the ranking's first
    con.print(f"iterations: {rep.iterations}   since last improvement: {rep.since_improvement}   "
              f"improvement threshold: +{rep.threshold * 100:.1f}%")
    for line in lines[1:]:
        con.print(line, highlight=False, soft_wrap=True)
    if rep.best_per_case:
        t = Table(title="best per case")
        for col in ("case", "variant", "candidate", "runtime ms", "speedup", "% limit", "basis"):
            t.add_column(col)
        for r in rep.best_per_case:
            t.add_row(str(int(r["case"])), r["variant"] or "-", r["candidate_id"],
                      f"{r['runtime_ms']:.4f}", _x(r["speedup"]), _pct(r.get("pct_limit")), r.get("basis") or "NA")
        con.print(t)
    if rep.recent:
        t = Table(title=f"last {len(rep.recent)} iterations")
        for col in ("iter", "label", "candidate", "geomean", "cases", "ragged", "% limit", "outcome"):
            t.add_column(col)
        for it in rep.recent:
            t.add_row(str(it.iteration), it.label, it.candidate_id or "NA", _x(it.geomean), str(it.n_cases),
                      _x(it.geomean_ragged), _pct(it.pct_limit), it.outcome)
        con.print(t)
        last = rep.recent[-1]
        if last.reason:
            con.print(f"iteration {last.iteration} {last.outcome}: {last.reason}", highlight=False)
    if rep.stagnating:
        con.print(f"[bold red]STAGNATION[/]: {rep.since_improvement} iterations without improvement"
                  + (" (recorded in candidates.jsonl)" if rep.recorded else ""))
        for i, step in enumerate(rep.protocol, 1):
            con.print(f"  ({i}) {step}")
