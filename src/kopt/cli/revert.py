"""`kopt revert [N|best]`: restore solution/ from a trajectory snapshot as a new commit."""

from __future__ import annotations

import typer


def command(
    target: str = typer.Argument("best", help="Iteration number, or 'best' (the best iteration by the improvement "
                                              "rule, as `kopt status` names it)."),
) -> None:
    """Restore solution/ from snapshot N (or the best iteration's) as a new revert commit, never a reset. An
    uncommitted attempt in solution/ is first committed as an iteration of its own (not judged without a verdict)."""
    from kopt.paths import workspace
    from kopt.workspace import commit

    attempt, res = commit.revert(workspace(), target.strip().lower())
    if attempt is not None:
        print(f"{attempt.message}  {attempt.sha[:10]}  snapshot {attempt.snapshot.name if attempt.snapshot else 'NA'}")
    print(f"{res.message}  {res.sha[:10]}")
