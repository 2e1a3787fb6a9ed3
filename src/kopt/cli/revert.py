"""`kopt revert [N|best]`: restore solution/ from a trajectory snapshot as a new commit (or into a folder)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def command(
    target: str = typer.Argument("best", help="Iteration number, or 'best' (the best iteration by the improvement "
                                              "rule, as `kopt status` names it)."),
    to: Optional[Path] = typer.Option(None, "--to", help="Write the snapshot's files (solution/, its tuning "
                                                         "tables) into this folder instead; commit nothing."),
) -> None:
    """Restore solution/ and its tuning table from snapshot N (or the best iteration's) as a new revert commit, never
    a reset, with the views remade. An uncommitted attempt in solution/ is first committed as an iteration of its own
    (not judged without a verdict)."""
    from kopt.paths import workspace
    from kopt.store import trajectory
    from kopt.workspace import revert

    if to is not None:
        path, meta = revert.pick_snapshot(workspace(), target.strip().lower())
        written = trajectory.extract(path, to)
        print(f"iteration {meta.iteration} ({path.name}): {len(written)} file(s) written under {to}")
        return
    attempt, res = revert.revert(workspace(), target.strip().lower())
    if attempt is not None:
        print(f"{attempt.message}  {attempt.sha[:10]}  snapshot {attempt.snapshot.name if attempt.snapshot else 'NA'}")
    print(f"{res.message}  {res.sha[:10]}")
    if res.refreshed:
        from kopt.paths import relative

        print("refreshed " + ", ".join(relative(p, workspace()) for p in res.refreshed))
    if res.warning:
        print(f"warning: {res.warning}")
