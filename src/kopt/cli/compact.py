"""`kopt compact`: the ledger and the trajectory stored lean, every row and snapshot reading back the same."""

from __future__ import annotations

import json

import typer


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.2f} MiB"


def command(
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would change; write nothing."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Store candidates.jsonl lean (a run's shared fields once; older rows in xz-compressed generations under
    candidates.archive/) and older trajectory snapshots as deltas; then `kopt commit` (or git) records it."""
    from dataclasses import asdict

    from kopt.paths import workspace
    from kopt.workspace.commit import compact_workspace

    res = compact_workspace(workspace(), dry_run=dry_run)
    led = res.ledger
    if as_json:
        print(json.dumps({"dry_run": dry_run, "ledger": {**asdict(led), "generation": str(led.generation or "")},
                          "snapshots": [asdict(m) for m in res.snapshots]}, indent=2))
        return
    verb = "would" if dry_run else ""
    print(f"ledger: {led.rows} rows, candidates.jsonl {_mib(led.before)} -> {_mib(led.after)}"
          + (f"; {led.archived} older rows {verb + ' go' if verb else 'went'} to {led.generation.parent.name}/"
             f"{led.generation.name} ({_mib(led.generation_bytes)})" if led.generation else "")
          + ("" if led.changed else " (already lean)"))
    before, after = sum(m.before for m in res.snapshots), sum(m.after for m in res.snapshots)
    print(f"trajectory: {len(res.snapshots)} snapshot(s) {'to store' if dry_run else 'stored'} lean, "
          f"{_mib(before)} -> {_mib(after)}")
