"""`kopt commit -m DESC`: snapshot the iteration into trajectory/ and commit `[iter N] DESC`."""

from __future__ import annotations

import typer


def command(
    message: str = typer.Option(..., "-m", "--message", help="What changed in this iteration."),
    allow_empty: bool = typer.Option(False, "--allow-empty", help="Commit an iteration although solution/ is "
                                                                  "unchanged and nothing was logged."),
) -> None:
    """Commit the iteration as `[iter N] DESC` with its trajectory snapshot.

    Only the workspace paths (solution/, results/, ITERATIONS.md, ledger, trajectory/, knowledge/), with the plots
    and report regenerated from them. Without a `kopt log` entry for this iteration one is written; with nothing
    changed in solution/ or knowledge/ and nothing logged the commit is refused (exit 2) unless --allow-empty."""
    import sys

    from kopt.paths import relative, workspace
    from kopt.workspace import commit

    ws = workspace()
    res = commit.commit_iteration(ws, message, allow_empty)
    print(f"{res.message}  {res.sha[:10]}  snapshot {res.snapshot.relative_to(ws).as_posix()}")
    if res.refreshed:
        print("refreshed " + ", ".join(relative(p, ws) for p in res.refreshed))
    if res.warning:
        print(f"kopt: warning: {res.warning}", file=sys.stderr)
