"""`kopt cases`: the case matrix as a table or JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from kopt.cli import options


def command(
    case: options.Case = None,
    file: Optional[Path] = typer.Option(None, "--file", help="Case file (default bench/cases.yaml)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Print the case matrix with the seed's C500 reference times (reference data, not measurements)."""
    from kopt.cases import load_cases, parse_ids, select
    from kopt.cli.common import out_console

    cases = select(load_cases(file), parse_ids(case))
    if as_json:
        rows = [{**c.model_dump(mode="json", exclude={"variant"}), "q_heads": c.q_heads,
                 "variant": c.variant.model_dump(mode="json")} for c in cases]
        print(json.dumps(rows, indent=2))
        return
    from rich.table import Table

    t = Table(title="kopt cases (head_dim, dtype and layout from the variant)")
    for col in ("id", "batch", "seqlen_k", "kv_heads", "gqa", "q_heads", "kind", "variant", "C500 ref ms"):
        t.add_column(col, justify="right" if col not in ("kind", "variant") else "left")
    for c in cases:
        t.add_row(str(c.id), str(c.batch), str(c.seqlen_k), str(c.kv_heads), str(c.gqa), str(c.q_heads),
                  c.kind, c.variant.label(), "NA" if c.c500_ref_ms is None else f"{c.c500_ref_ms:.3f}")
    out_console().print(t)
