"""`kopt commit`: one iteration into git: its trajectory snapshot, the committed views (plots, report)
regenerated from it, and the `[iter N]` commit of the workspace paths (kopt.workspace.vcs does the git). In kopt's
own source tree the package templates copied from the workspace files (kopt.workspace.scaffold) are refreshed and
committed with them, so a new workspace starts from the knowledge the iteration wrote."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from kopt.errors import LedgerError, UsageError, WorkspaceError
from kopt.paths import ledger_file
from kopt.report import refresh_for_commit
from kopt.workspace import ledger, scaffold, trajectory, vcs


def commit_iteration(ws: Path, description: str) -> vcs.CommitResult:
    """Snapshot the iteration into trajectory/ and commit the workspace paths as `[iter N] description`."""
    description = " ".join((description or "").split())
    if not description:
        raise UsageError("give a description: kopt commit -m \"what changed\"")
    repo = vcs.open_repo(ws)
    vcs.check_state(repo)
    specs = vcs.pathspecs(repo, ws)
    templates = scaffold.own_templates(ws)
    synced = []
    if templates is not None:  # kopt's own tree: the templates follow SKILL, HINTS, knowledge, the starter kernel
        synced = [templates / rel for rel in scaffold.sync_templates(ws)]
        specs += vcs.pathspecs(repo, ws, (scaffold.OWN_TEMPLATES,))
    if not vcs.changed(repo, specs):
        raise WorkspaceError("nothing changed in the workspace paths (solution/, results/, ITERATIONS.md, "
                             "candidates.jsonl, candidates.archive/, trajectory/, knowledge/) since the last commit")
    n = vcs.iterations_done(repo) + 1
    description = _without_prefix(description, n)
    try:  # the ledger stored lean, older rows archived; refused (nothing written) unless every row reads back
        ledger.compact(ledger_file(ws))
        lean_warning = None
    except LedgerError as e:
        lean_warning = f"ledger left as it was: {e}"
    snap = trajectory.write(ws, n, description, repo.active_branch.name,
                            repo.head.commit.hexsha if repo.head.is_valid() else None)
    refreshed, warning = refresh_for_commit(ws)  # after the snapshot: the trajectory has this iteration
    message = f"[iter {n}] {description}"
    try:
        sha = vcs.commit(repo, message, specs)
    except WorkspaceError:  # leave no half iteration behind: drop the snapshot from disk and index
        shutil.rmtree(snap, ignore_errors=True)
        spec = vcs.pathspecs(repo, ws, (snap.relative_to(ws).as_posix(),))
        repo.git.rm("-r", "-q", "--cached", "--ignore-unmatch", "--", *spec)
        raise
    warning = "; ".join(w for w in (lean_warning, warning) if w) or None
    return vcs.CommitResult(n, message, sha, snap, synced + list(refreshed), warning)


def _without_prefix(description: str, n: int) -> str:
    """The description without a leading `[iter N]` of its own (the commit adds it); one naming another
    iteration than the one being committed is refused."""
    m = re.match(r"\[iter (\d+)\]\s*", description)
    if not m:
        return description
    if int(m.group(1)) != n:
        raise UsageError(f"the message starts with [iter {m.group(1)}], but this commit is iteration {n}: "
                         "leave the prefix out, kopt commit adds it")
    rest = description[m.end():]
    if not rest:
        raise UsageError("give a description after the prefix: kopt commit -m \"what changed\"")
    return rest


@dataclass
class Compaction:
    """What `kopt compact` did (or, dry, would do)."""

    ledger: ledger.Compacted
    snapshots: list[trajectory.Migrated]


def compact_workspace(ws: Path, dry_run: bool = False) -> Compaction:
    """Store the workspace lean: the ledger (run records, older rows archived: kopt.workspace.ledger.compact) and
    every schema 1 trajectory snapshot (its files as a delta: kopt.workspace.trajectory.migrate). Every row and
    snapshot is checked to read back the same before it replaces the old one. The result is for `kopt commit`."""
    return Compaction(ledger.compact(ledger_file(ws), dry_run=dry_run), trajectory.migrate(ws, dry_run=dry_run))
