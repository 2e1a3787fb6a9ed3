"""`kopt workloads`: the workload library (bench/workloads.yaml) as a table or JSON, and a draw from it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer


def command(
    draw: Optional[int] = typer.Option(None, "--draw", min=1, max=256, help="Show N held-out cases drawn as "
                                                                            "`kopt verify` would draw them."),
    seed: int = typer.Option(0, "--seed", "--heldout-seed", min=0,
                             help="With --draw: the draw's seed (as kopt verify, bench and profile take it)."),
    cpu: bool = typer.Option(False, "--cpu", help="With --draw: the draw cut to CPU size, as a CPU verdict runs it."),
    file: Optional[Path] = typer.Option(None, "--file", help="Workload file (default bench/workloads.yaml)."),
    plan_for: Optional[str] = typer.Option(
        None, "--plan-for", help="With --draw: a device of hardware.yaml (e.g. H200, C500); add the plan the candidate "
                                 "resolves for each draw there, from the device's profile (no GPU needed)."),
    candidate: Optional[Path] = typer.Option(None, "--candidate", help="With --plan-for: the candidate file (default "
                                                                        "solution/tilelang/run_kernel.py), "
                                                                        "REV:PATH.py at a commit or branch, or "
                                                                        "CHANGE.patch over the shipped one."),
    against: Optional[Path] = typer.Option(None, "--against", help="With --plan-for: a second candidate file (or "
                                                                    "REV:PATH.py or .patch); add its plans and mark "
                                                                    "the draws whose plans differ (the draws an A/B "
                                                                    "of the two must time)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List the model shapes held-out draws come from, or show a draw (and, with --plan-for, each draw's plan)."""
    from kopt import workloads
    from kopt.cli.common import out_console
    from kopt.errors import UsageError

    if plan_for is None and (candidate or against):
        raise UsageError("--candidate and --against name the candidates whose plans --plan-for DEVICE shows")
    if plan_for is not None and not draw:
        raise UsageError("--plan-for shows the plans of a draw: add --draw N")
    from kopt.candidate import is_revision

    for flag, path in (("--candidate", candidate), ("--against", against)):
        if path is not None and not is_revision(path) and not path.is_file():
            raise UsageError(f"{flag} {path}: no such candidate file")
    wf = workloads.load(file)
    note = ""
    if draw:
        cases = workloads.draw(wf, draw, seed, cpu=cpu)
        rows = [{"case": c.id, "model": c.model, "shape": c.shape_label(), "variant": c.variant.label(),
                 "batch": c.batch, "max_len": c.seqlen_k, "valid_keys": c.valid_keys} for c in cases]
        title = f"kopt workloads: {draw} held-out draws, seed {seed}{' (CPU size)' if cpu else ''}"
        if plan_for is not None:
            rows, note = _with_plans(rows, cases, plan_for, candidate, against)
            title += f"; plans on {plan_for}"
    else:
        rows = [{"model": m.name, "q_heads": m.q_heads, "kv_heads": m.kv_heads, "gqa": m.gqa,
                 "head_dim": m.head_dim, "max_context": m.max_context} for m in wf.models]
        title = (f"kopt workloads: {len(rows)} models; lengths {', '.join(d.kind for d in wf.lengths)}; batches "
                 f"{wf.batches}; pages {['contig' if p is None else p for p in wf.page_sizes]}; "
                 f"{', '.join(d.value for d in wf.dtypes)}")
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    from rich.table import Table

    t = Table(title=title)
    shown = [col for col in rows[0] if not col.endswith("_detail")]
    for col in shown:
        t.add_column(col, justify="left" if col in ("model", "shape", "variant", "plan", "against") else "right")
    for r in rows:
        t.add_row(*(str(r[col]) for col in shown))
    con = out_console()
    con.print(t)
    if note:
        con.print(note, highlight=False)


def _with_plans(rows: list[dict], cases: list, device: str, candidate: Optional[Path], against: Optional[Path]):
    """The draw's rows with each one's plan on `device` (a few words; its whole dict under plan_detail, JSON only),
    and, with `against`, the other candidate's plan, whether the two differ and in which fields; and the line under
    the table."""
    from kopt import paths
    from kopt.doctor import case_plans, plan_fields_apart, plan_label

    mine = case_plans(device, cases, candidate)
    for r, p in zip(rows, mine):
        r["plan"] = plan_label(p["plan"]) if p["plan"] else f"NA: {p['why']}"
        r["plan_detail"] = p["plan"]
    if against is None:
        return rows, ""
    theirs = case_plans(device, cases, against)
    for r, p in zip(rows, theirs):
        r["against"] = plan_label(p["plan"]) if p["plan"] else f"NA: {p['why']}"
        r["against_detail"] = p["plan"]
        apart = plan_fields_apart(r["plan_detail"], p["plan"])
        r["differs"], r["fields"] = bool(apart), ",".join(apart) or "-"
    n = sum(r["differs"] for r in rows)
    from kopt.candidate import is_revision

    def shown(p):  # a revision as given (REV:PATH), a file relative to the workspace
        return str(p) if is_revision(p) else paths.relative(p)

    name = shown(candidate or paths.default_candidate())
    return rows, (f"{n} of {len(rows)} draws plan differently on {device}: {name} against {shown(against)}"
                  + (f" (cases {','.join(str(r['case']) for r in rows if r['differs'])})" if n else ""))
