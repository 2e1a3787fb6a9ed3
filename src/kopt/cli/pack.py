"""`kopt pack`: what travels to a GPU host and whether it fits; `--out DIR` writes a lean copy that holds only what a
run there reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.2f} MiB"


def command(
    out: Optional[Path] = typer.Option(None, "--out", help="Write the lean copy here (a new or empty folder)."),
    carry: list[Path] = typer.Option([], "--carry", help="An ignored folder sent along (an offline site folder, a "
                                                         "peer kernel's build); repeat for several."),
    limit_mib: float = typer.Option(64.0, "--limit-mib", min=0.01, help="The limit on what travels, in MiB."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The working tree that travels (tracked files, untracked files git does not ignore, carried folders), entry
    by entry, against the limit, and what a lean copy would hold. Exit code 1 when it does not fit."""
    from kopt.paths import workspace
    from kopt.workspace import pack

    limit = int(limit_mib * (1 << 20))
    root = workspace()
    t = pack.write_lean(root, out, tuple(carry), limit) if out else pack.measure(root, tuple(carry), limit)
    d = t.to_dict()
    if as_json:
        print(json.dumps(d, indent=2))
    else:
        _render(t, d, limit, bool(out))
    if not d["fits"]:
        raise typer.Exit(1)


def _render(t, d: dict, limit: int, lean_copy: bool) -> None:
    """The entries, the total against the limit, and (measuring the tree) what a lean copy would hold."""
    print(f"what travels from {t.root}{' (the lean copy)' if lean_copy else ''}: tracked files, untracked files "
          f"git does not ignore, carried folders; commit {t.commit or 'NA'}")
    for e in t.entries:
        print(f"  {e.name + (' (carried)' if e.carried else ''):<34} {e.files:>6} files {_mib(e.bytes):>12}")

    def verdict(total: int) -> str:
        room = limit - total
        return f"{_mib(total)} of {_mib(limit)}: " + (f"fits, {_mib(room)} to spare" if room >= 0 else
                                                      f"does NOT fit, {_mib(-room)} over")

    print(f"total {verdict(d['total'])}")
    if not lean_copy:
        print(f"a lean copy (kopt pack --out DIR) holds {_mib(t.lean_bytes)} of it: with the carried folders "
              f"{verdict(d['lean_total'])}")
