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

    con = out_console()
    for line in lines(d):
        con.print(line, highlight=False, soft_wrap=True)


#: Names of the version rows, in print order.
VERSIONS = ("python", "torch", "tilelang", "flash_attn", "nvcc", "kopt")


def lines(d: dict) -> list[str]:
    """The report as rich-markup lines: one label column, as wide as its longest label plus two."""
    dev = d["device"]
    labels = ("device", *VERSIONS, "profilers", "kept child", "bytecode", "will run", "will not run")
    w = max(map(len, labels)) + 2

    def row(label: str, value: str, style: str = "bold") -> str:
        return f"[{style}]{label}[/{style}]{' ' * (w - len(label))}{value}"

    out = [row("device", str(dev.get("name")) + (f"  cc {dev['capability']}  {dev['units']} units  "
               f"{dev['l2_mib']} MiB L2  arch {dev['tilelang_arch']}" if "capability" in dev else ""))]
    out += [row(k, d[k] or "not found") for k in VERSIONS]
    out.append(row("profilers", ", ".join(f"{k}:{'yes' if v else 'no'}" for k, v in d["profilers"].items())))
    kept = d.get("kept_children") or []
    out += [row("kept child", f"supervisor pid {k['pid']} (ends after {k['keep_s']:g} s idle, or kill it)")
            for k in kept] or [row("kept child", "none (a CUDA run leaves one for the next: kopt.eval.warm)")]
    cache = d.get("bytecode_cache")
    out.append(row("bytecode", f"cached in {cache} (the environment writes none: kopt.bytecode)" if cache
                   else "Python's own rule"))
    out += [row("will run", x, "green") for x in d["will_run"]]
    out += [row("will not run", x, "yellow") for x in d["will_not_run"]]
    return out
