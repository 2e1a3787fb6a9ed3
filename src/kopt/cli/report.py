"""`kopt report`: one self-contained HTML report of the campaign (and its screenshot)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer


def command(
    out: Optional[Path] = typer.Option(None, "--out", help="HTML file (default results/<backend>/report.html)."),
    as_json: bool = typer.Option(False, "--json", help="Print the written files as JSON."),
    device: Optional[str] = typer.Option(None, "--device", help="Only rows measured on this device (e.g. H200)."),
    screenshot: bool = typer.Option(False, "--screenshot",
                                    help="Also write a PNG of the rendered page beside it (headless Chromium)."),
) -> None:
    """The shown candidate, every case, plots, peers, trajectory and the latest diagnosis, plots inlined; with
    neither --out nor --device, results/STATUS.md beside it (where the kernel stands, one table)."""
    from kopt.cli.common import err_console
    from kopt.errors import BrowserError
    from kopt.paths import workspace
    from kopt.report import browser, build, status_md
    from kopt.report.campaign import load_campaign

    if screenshot and browser.find() is None:  # before any work: the page alone is not what was asked
        raise BrowserError("--screenshot needs a headless Chromium (Debian: apt-get install chromium)")
    ws = workspace()
    with err_console().status("building the report..."):
        c = load_campaign(ws, device)  # an unknown --device is a usage error here, before any file is written
        files = [build(ws, out, device, campaign=c)]
        if screenshot:
            files.append(browser.screenshot(files[0], files[0].with_suffix(".png")))
        if out is None and device is None:  # the workspace's own view, not a side copy
            files.append(status_md.write(ws, campaign=c))
    if as_json:
        print(json.dumps({"file": str(files[0]), "files": [str(f) for f in files]}))
        return
    for f in files:
        print(f)
