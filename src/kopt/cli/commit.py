"""`kopt commit -m DESC`: snapshot the iteration into trajectory/ and commit `[iter N] DESC`."""

from __future__ import annotations

import typer


def command(
    message: str = typer.Option(..., "-m", "--message", help="What changed in this iteration."),
) -> None:
    """Commit the workspace paths only (solution/, results/, ITERATIONS.md, ledger, trajectory/, knowledge/)."""
    from kopt import vcs
    from kopt.paths import workspace

    ws = workspace()
    res = vcs.commit_iteration(ws, message)
    print(f"{res.message}  {res.sha[:10]}  snapshot {res.snapshot.relative_to(ws).as_posix()}")
