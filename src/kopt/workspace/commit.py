"""`kopt commit`: one iteration into git: its trajectory snapshot, the committed views (plots, report)
regenerated from it, and the `[iter N]` commit of the workspace paths (kopt.store.vcs does the git)."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from kopt.errors import LedgerError, UsageError, WorkspaceError
from kopt.paths import ledger_file
from kopt.policy import iterations
from kopt.report import refresh_for_commit
from kopt.store import journal, ledger, trajectory, vcs
from kopt.workspace import log


def commit_iteration(ws: Path, description: str, allow_empty: bool = False) -> vcs.CommitResult:
    """Snapshot the iteration into trajectory/ and commit the workspace paths as `[iter N] description`.

    An iteration is an edit of solution/ or knowledge/ since the last `[iter N]` commit, or a logged entry N: with
    neither it is refused (UsageError, exit 2) unless `allow_empty` (the ledger and results/ alone are kopt's writes,
    not an iteration). Without an entry N in ITERATIONS.md, one is written
    (Changes and Bench filled in, as `kopt log` does) so the log never skips a number."""
    description = " ".join((description or "").split())
    if not description:
        raise UsageError("give a description: kopt commit -m \"what changed\"")
    repo = vcs.open_repo(ws)
    vcs.check_state(repo)
    n = vcs.iterations_done(repo) + 1
    logged = journal.entry_text(ws, n) is not None
    if not logged and not allow_empty and not authored_changed(repo, ws):
        raise UsageError(f"nothing changed for iteration {n}: solution/ and knowledge/ are as the last iteration left "
                         f"them and ITERATIONS.md has no entry {n}; edit the kernel, or `kopt log ...` first, or pass "
                         "--allow-empty")
    if not logged:
        log.log_iteration(ws, title=_without_prefix(description, n), analysis=UNLOGGED)
    specs = vcs.pathspecs(repo, ws)
    if not vcs.changed(repo, specs):
        raise WorkspaceError("nothing changed in the workspace paths (solution/, results/, ITERATIONS.md, "
                             "candidates.jsonl, candidates.archive/, trajectory/, knowledge/) since the last commit")
    description = _without_prefix(description, n)
    try:  # the ledger stored lean, older rows archived; refused (nothing written) unless every row reads back
        ledger.compact(ledger_file(ws))
        lean_warning = None
    except LedgerError as e:
        lean_warning = f"ledger left as it was: {e}"
    snap = trajectory.write(ws, n, description, repo.active_branch.name,
                            repo.head.commit.hexsha if repo.head.is_valid() else None, iterations.snapshot_verdict(ws))
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
    return vcs.CommitResult(n, message, sha, snap, list(refreshed), warning)


#: The Analysis of an entry `kopt commit` wrote because none was logged.
UNLOGGED = "_(not logged: `kopt commit` wrote this entry; no hypothesis or analysis was given)_"


def authored_changed(repo, ws: Path) -> bool:
    """Whether solution/ or knowledge/ differs from the last `[iter N]` commit (HEAD when there is none), untracked
    files included: what makes a commit an iteration of its own."""
    spec = vcs.pathspecs(repo, ws, ("solution", "knowledge"))
    base = next(iter(vcs.iteration_commits(repo)), None) or ("HEAD" if repo.head.is_valid() else None)
    if base is None:
        return True
    return bool(repo.git.diff("--name-only", base, "--", *spec).strip()
                or repo.git.ls_files("--others", "--exclude-standard", "--", *spec).strip())


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
    """Store the workspace lean: the ledger (run records, older rows archived: kopt.store.ledger.compact) and
    every schema 1 trajectory snapshot (its files as a delta: kopt.store.trajectory.migrate). Every row and
    snapshot is checked to read back the same before it replaces the old one. The result is for `kopt commit`."""
    return Compaction(ledger.compact(ledger_file(ws), dry_run=dry_run), trajectory.migrate(ws, dry_run=dry_run))
