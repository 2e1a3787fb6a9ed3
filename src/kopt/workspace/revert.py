"""`kopt revert`: solution/ restored from a trajectory snapshot (kopt.store.trajectory) as a new commit, never a
reset; an uncommitted attempt is recorded first (kopt.workspace.commit), and "best" is chosen by the improvement
rule, else by the ranking (kopt.policy)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Optional

from kopt.errors import UsageError, WorkspaceError
from kopt.store import trajectory, vcs


def revert(ws: Path, target: str = "best") -> tuple[Optional[vcs.CommitResult], vcs.CommitResult]:
    """`kopt revert`: an uncommitted attempt in solution/ is first recorded as an iteration of its own (failed
    attempts are data), then solution/ is restored from snapshot N, or from the best iteration by the improvement
    rule ("best"; the ledger's top-ranked candidate when no iteration improved). Returns (the attempt's commit or
    None, the revert commit)."""
    from kopt.policy import iterations
    from kopt.workspace.commit import commit_iteration

    repo = vcs.open_repo(ws)
    vcs.check_state(repo)
    attempt = None
    if vcs.changed(repo, vcs.pathspecs(repo, ws, ("solution", *trajectory.tables(ws)))):
        attempt = commit_iteration(ws, "attempt, reverted by kopt revert")
    if target == "best":
        best = iterations.best_iteration(iterations.history(ws))
        target = str(best.iteration) if best else target
    return attempt, restore(ws, target)


def pick_snapshot(ws: Path, target: str = "best") -> tuple[Path, trajectory.SnapshotMeta]:
    """The snapshot of iteration `target` (its last, when several), or of the best-ranked candidate in the
    ledger that has one ('best')."""
    snaps = [(p, m) for p, m in trajectory.snapshots(ws) if trajectory.restorable(p)]
    if not snaps:
        raise WorkspaceError("no trajectory snapshots yet: `kopt commit` records one per iteration")
    if target == "best":
        return _best_snapshot(ws, snaps)
    if not target.isdigit():
        raise UsageError(f"revert target must be an iteration number or 'best', not {target!r}")
    found = [(p, m) for p, m in snaps if m.iteration == int(target)]
    if not found:
        have = ", ".join(str(m.iteration) for _, m in snaps)
        raise UsageError(f"no trajectory snapshot for iteration {target} (have: {have})")
    return found[-1]


def _best_snapshot(ws: Path, snaps: list[tuple[Path, trajectory.SnapshotMeta]]) -> tuple[Path, trajectory.SnapshotMeta]:
    """The snapshot of the best-ranked candidate (geomean from the ledger) that has one."""
    from kopt.paths import ledger_file
    from kopt.policy import ranking

    by_cid: dict[str, tuple[Path, trajectory.SnapshotMeta]] = {}
    for p, m in snaps:
        if m.candidate_id:
            by_cid.setdefault(m.candidate_id, (p, m))  # the first iteration that committed it
    df, _ = ranking.load_frame(ledger_file(ws))
    for cid in ranking.rank(df)["candidate_id"]:
        if cid in by_cid:
            return by_cid[cid]
    raise WorkspaceError("no trajectory snapshot holds a candidate ranked in candidates.jsonl: "
                         "give an iteration number instead (`kopt revert N`)")


def restore(ws: Path, target: str = "best") -> vcs.CommitResult:
    """Restore solution/ and the tuning tables the snapshot holds (the plans the iteration was measured with) from
    snapshot N (or the best candidate's), byte for byte, as a NEW commit `[revert] ...`."""
    from kopt.paths import relative
    from kopt.report import refresh_for_commit
    from kopt.store import delta

    repo = vcs.open_repo(ws)
    vcs.check_state(repo)
    path, meta = pick_snapshot(ws, target)
    got = {rel: f for rel, f in trajectory.files(path).items()
           if rel.startswith("solution/") or trajectory.is_table(rel)}
    tables = sorted(rel for rel in got if trajectory.is_table(rel))  # the tables the candidate was measured with
    moved = [rel for rel in tables if not (Path(ws) / rel).is_file() or (Path(ws) / rel).read_bytes() != got[rel][0]]
    specs = vcs.pathspecs(repo, ws, ("solution", *tables))
    if vcs.changed(repo, specs):
        raise WorkspaceError("solution/ or its tuning table has uncommitted changes: commit them (`kopt commit`) or "
                             "discard them first")
    sol = Path(ws) / "solution"
    shutil.rmtree(sol, ignore_errors=True)
    delta.write_tree(ws, got)
    if not vcs.changed(repo, specs):
        raise WorkspaceError(f"solution/ already matches iteration {meta.iteration}: nothing to revert")
    message = f"{vcs.REVERT_PREFIX}solution from iter {meta.iteration}" + (" (and its tuning table)" if moved else "")
    refreshed, warning = refresh_for_commit(ws)  # the views name the shipped candidate: they change with it
    specs += vcs.pathspecs(repo, ws, [relative(p, ws) for p in refreshed])
    return vcs.CommitResult(meta.iteration, message, vcs.commit(repo, message, specs), path, list(refreshed),
                            warning)
