"""`kopt workloads`: the workload library (bench/workloads.yaml) as a table or JSON, and a draw from it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer


def command(
    draw: Optional[int] = typer.Option(None, "--draw", min=1, max=256, help="Show N held-out cases drawn as "
                                                                            "`kopt verify` would draw them."),
    seed: int = typer.Option(0, "--seed", min=0, help="With --draw: the draw's seed (kopt verify --heldout-seed)."),
    cpu: bool = typer.Option(False, "--cpu", help="With --draw: the draw cut to CPU size, as a CPU verdict runs it."),
    file: Optional[Path] = typer.Option(None, "--file", help="Workload file (default bench/workloads.yaml)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List the model shapes held-out draws come from, or show a draw."""
    from kopt import workloads
    from kopt.cli.common import out_console

    wf = workloads.load(file)
    if draw:
        cases = workloads.draw(wf, draw, seed, cpu=cpu)
        rows = [{"case": c.id, "model": c.model, "shape": c.shape_label(), "variant": c.variant.label(),
                 "batch": c.batch, "max_len": c.seqlen_k, "valid_keys": c.valid_keys} for c in cases]
        title = f"kopt workloads: {draw} held-out draws, seed {seed}{' (CPU size)' if cpu else ''}"
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
    for col in rows[0]:
        t.add_column(col, justify="left" if col in ("model", "shape", "variant") else "right")
    for r in rows:
        t.add_row(*(str(v) for v in r.values()))
    out_console().print(t)
