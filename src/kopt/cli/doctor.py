"""`kopt doctor`: what this machine has and what kopt will run on it."""

from __future__ import annotations

import json

import typer


def command(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Device, arch, torch/TileLang/flash-attn versions, nvcc, profilers; what will and will not run."""
    from kopt.doctor import report

    d = report()
    if as_json:
        print(json.dumps(d, indent=2))
        return
    from kopt.cli.common import out_console

    c = out_console()
    dev = d["device"]
    c.print(f"[bold]device[/bold]    {dev.get('name')}" + (f"  cc {dev['capability']}  {dev['units']} units  "
            f"{dev['l2_mib']} MiB L2  arch {dev['tilelang_arch']}" if "capability" in dev else ""))
    for k in ("python", "torch", "tilelang", "flash_attn", "nvcc", "kopt"):
        c.print(f"[bold]{k:<10}[/bold]{d[k] or 'not found'}")
    c.print("[bold]profilers[/bold] " + ", ".join(f"{k}:{'yes' if v else 'no'}" for k, v in d["profilers"].items()))
    for x in d["will_run"]:
        c.print(f"[green]will run[/green]      {x}")
    for x in d["will_not_run"]:
        c.print(f"[yellow]will not run[/yellow]  {x}")
