"""`kopt candidates`: the ledger ranked — geomean per candidate, best per case, lineage."""

from __future__ import annotations

import json
from typing import Optional

import typer

TEXT_TOP = 20
#: (field, header, format; None = text) of the terminal tables.
COLUMNS = [("rank", "#", "d"), ("candidate_id", "candidate", None), ("shown_as", "mark", None),
           ("geomean", "geomean", ".3f"), ("n_cases", "cases", "d"), ("geomean_ragged", "ragged", ".3f"),
           ("n_ragged", "r cases", "d"),
           ("pct_limit", "% limit", ".1f"), ("n_incorrect", "bad", "d"), ("basis", "basis", None),
           ("technique", "technique", None), ("ancestors", "parent", None)]
#: Marks of the shown candidate (by its source) and of the rule's best, in the `mark` column.
MARKS = {"shipped": "ship", "ledger best": "top", "rule": "rule"}
COLUMNS_CASE = [("rank", "#", "d"), ("candidate_id", "candidate", None), ("variant", "variant", None),
                ("runtime_ms", "runtime ms", ".4f"), ("ref_runtime_ms", "ref ms", ".4f"),
                ("speedup", "speedup", ".3f"), ("pct_limit", "% limit", ".1f"), ("mode", "mode", None)]


def _short(parents: list[str]) -> str:
    """Ancestors for a terminal: the parent, then how many more (--json/--csv give the whole chain)."""
    return parents[0] + (f" +{len(parents) - 1}" if len(parents) > 1 else "") if parents else "-"


def command(
    top: Optional[int] = typer.Option(None, "--top", min=1, help="Show the N best candidates."),
    case: Optional[str] = typer.Option(None, "--case", "-c", help="Rank candidates on one case by runtime (one id)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    as_csv: bool = typer.Option(False, "--csv", help="Print the ranking as CSV."),
    device: Optional[str] = typer.Option(None, "--device", help="Only rows measured on this device (e.g. H200, cpu)."),
) -> None:
    """Rank candidates.jsonl: geomean speedup per candidate, uniform and ragged cases apart (verdict rows
    preferred), with the % of the roofline limit; best per case."""
    from kopt.cli.common import err_console, out_console
    from kopt.errors import UsageError
    from kopt.paths import ledger_file, workspace
    from kopt.policy import ranking, shown_candidate
    from kopt.records import fmt_na

    if as_json and as_csv:
        raise UsageError("--json and --csv are exclusive")
    from kopt.cli.options import one_case
    from kopt.policy import check_device
    from kopt.policy.shown import ranking_device
    from kopt.store import load_dicts

    case = one_case(case)
    loaded = load_dicts(ledger_file())
    check_device(loaded.rows, device)
    # times of different devices never share a rank: unless --device names one, the shipped candidate's device
    ranked_on = ranking_device(workspace(), loaded.rows, device)
    # A terminal table of hundreds of rows is unreadable (and slow to lay out): 20 unless asked.
    rep = ranking.report(ledger_file(), top=top or (None if as_json or as_csv else TEXT_TOP), case=case,
                         device=ranked_on, loaded=loaded)
    if rep.skipped:
        err_console().print(f"[yellow]skipped {len(rep.skipped)} unreadable ledger line(s)[/]")
    table = rep.candidates.assign(lineage=[" <- ".join(rep.lineage[c]) for c in rep.candidates["candidate_id"]])
    if as_csv:
        print(table.to_csv(index=False), end="")
        return
    first = ranking.records(rep.candidates.head(1)) if case is None else []  # the ranking's first: not ranked again
    shown = shown_candidate(workspace(), rep.rows, device=device, top=first[0] if first else None)
    if as_json:
        print(json.dumps({"case": case, "device": ranked_on, "shown": shown.brief(),
                          "candidates": ranking.records(table),
                          "best_per_case": ranking.records(rep.best_per_case),
                          "skipped_lines": len(rep.skipped)}, indent=2))
        return
    from rich.table import Table

    con = out_console()
    if not len(table):
        scope = ", ".join(x for x in (f"case {case}" if case is not None else "",
                                      f"device {device}" if device else "") if x)
        con.print(f"no candidate rows for {scope} among the ledger's {len(rep.rows)} rows" if rep.rows and scope
                  else "no candidate rows in candidates.jsonl yet")
        return
    for line in shown.lines():
        con.print(line, highlight=False, soft_wrap=True)
    mark = {shown.candidate_id: MARKS.get(shown.source, ""),
            **({shown.best_by_rule.candidate_id: MARKS["rule"]} if shown.best_by_rule else {})}
    where = f" on {ranked_on}" if ranked_on else ""
    t = Table(title=f"candidates on case {case}{where}" if case is not None else
              f"candidates{where} (geomean speedup)")
    spec = COLUMNS_CASE if case is not None else COLUMNS
    for _, head, fmt in spec:
        t.add_column(head, justify="left" if fmt is None else "right", min_width=12 if head == "candidate" else None)
    for r in ranking.records(table):
        r["ancestors"] = _short(rep.lineage[r["candidate_id"]][1:])
        r["shown_as"] = mark.get(r["candidate_id"], "")
        t.add_row(*[("NA" if r[k] is None else str(r[k]) if fmt is None else format(r[k], fmt)) for k, _, fmt in spec])
    con.print(t)
    if case is None:
        con.print("mark: ship = the shipped candidate (shown), top = the top-ranked one (shown: no solution/), "
                  "rule = the best by the improvement rule", style="dim", highlight=False)
    if ranked_on and not device:
        con.print(f"ranked over rows measured on {ranked_on}, the shipped candidate's device (--device for another)",
                  style="dim", highlight=False)
    if top is None and len(table) == TEXT_TOP:
        con.print(f"(first {TEXT_TOP}; --top N, --json or --csv for more)")
    b = Table(title="best per case (lowest runtime among correct rows)")
    for c in ("case", "variant", "candidate_id", "runtime ms", "ref ms", "speedup", "% limit", "basis"):
        b.add_column(c)
    for r in ranking.records(rep.best_per_case):
        b.add_row(str(int(r["case"])), r["variant"] or "-", r["candidate_id"], fmt_na(r["runtime_ms"]),
                  fmt_na(r["ref_runtime_ms"]), fmt_na(r["speedup"], "{:.3f}"), fmt_na(r["pct_limit"], "{:.1f}"),
                  r.get("basis") or r["mode"])
    con.print(b)
