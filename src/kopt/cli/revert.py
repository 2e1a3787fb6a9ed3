"""`kopt revert [N|best]`: restore solution/ from a trajectory snapshot as a new commit."""

from __future__ import annotations

import typer


def command(
    target: str = typer.Argument("best", help="Iteration number, or 'best' (best geomean in the ledger)."),
) -> None:
    """Restore solution/ from snapshot N (or the best candidate's) as a new revert commit, never a reset."""
    from kopt.paths import workspace
    from kopt.workspace import vcs

    res = vcs.revert(workspace(), target.strip().lower())
    print(f"{res.message}  {res.sha[:10]}")
