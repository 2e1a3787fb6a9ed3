"""`kopt report`: one self-contained HTML report of the campaign."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer


def command(
    out: Optional[Path] = typer.Option(None, "--out", help="HTML file (default results/<backend>/report.html)."),
    as_json: bool = typer.Option(False, "--json", help="Print the written file as JSON."),
    device: Optional[str] = typer.Option(None, "--device", help="Only rows measured on this device (e.g. H200)."),
) -> None:
    """Cases table, best candidate, trajectory and the latest diagnosis, plots inlined."""
    from kopt.cli.common import err_console
    from kopt.paths import workspace
    from kopt.report import build

    with err_console().status("building the report..."):
        path = build(workspace(), out, device)
    print(json.dumps({"file": str(path)}) if as_json else path)
