"""`kopt plot`: campaign figures (PNG) from the ledger and committed results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer


def command(
    out: Optional[Path] = typer.Option(None, "--out", help="Output folder (default results/<backend>/plots/)."),
    as_json: bool = typer.Option(False, "--json", help="Print the written files as JSON."),
    device: Optional[str] = typer.Option(None, "--device", help="Only rows measured on this device (e.g. H200)."),
) -> None:
    """Per-case speedup (with CI) beside C500 reference times, % of copy bandwidth, trajectory."""
    from kopt.cli.common import err_console
    from kopt.paths import workspace
    from kopt.report.plot import make_plots

    ws = workspace()
    with err_console().status("plotting..."):
        files = make_plots(ws, out, device=device)
    if as_json:
        print(json.dumps({"files": [str(f) for f in files]}))
        return
    for f in files:
        print(f)
