"""Git for the loop (GitPython, imported lazily): `[iter N]` commits, trajectory snapshots, reverts.

Iteration numbering rule (one rule, used by `kopt log`, `kopt commit` and `kopt status`):
N = 1 + the number of commits reachable from HEAD whose subject starts with `[iter `.
Git history is the source of truth and kopt never rewrites it, so numbers are stable; `[revert]`
and hand-made commits do not count. Outside a git repository `kopt log` falls back to
"last ITERATIONS.md entry + 1".

Only the workspace paths are ever staged, and commits are made with an explicit pathspec
(`git commit -- <paths>`), so an unrelated file stays out even if it was staged by hand.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, Field

from kopt.errors import UsageError, WorkspaceError
from kopt.paths import CANDIDATE_REL

WORKSPACE_PATHS = ("solution", "results", "ITERATIONS.md", "candidates.jsonl", "trajectory", "knowledge")
ITER_RE = re.compile(r"^\[iter (\d+)\]")
_STATE_FILES = (("MERGE_HEAD", "a merge"), ("CHERRY_PICK_HEAD", "a cherry-pick"), ("REVERT_HEAD", "a git revert"),
                ("rebase-merge", "a rebase"), ("rebase-apply", "a rebase or git am"))


class SnapshotMeta(BaseModel):
    """trajectory/<N>-<stamp>-<label>/meta.json: what one iteration committed and how it measured."""

    schema_version: int = 1
    iteration: int = Field(ge=1)
    label: str
    description: str
    created: str
    """UTC time of the snapshot, ISO 8601."""
    candidate_path: str = CANDIDATE_REL
    candidate_hash: Optional[str] = None
    """sha256 of the candidate file's bytes (the bench's candidate_hash); None when absent."""
    candidate_id: Optional[str] = None
    """First 12 hex of candidate_hash: the key into candidates.jsonl."""
    geomean: Optional[float] = Field(default=None, gt=0)
    """Geomean speedup of the candidate's latest verdict over its correct uniform cases; None = no verdict."""
    n_cases: int = Field(0, ge=0)
    geomean_ragged: Optional[float] = Field(default=None, gt=0)
    """Geomean speedup over its correct ragged cases; None = none timed (and in older snapshots)."""
    n_ragged: int = Field(0, ge=0)
    pct_limit: Optional[float] = Field(default=None, ge=0)
    """Geomean PCT_LIMIT over the correct uniform cases that have one (None in older snapshots)."""
    pct_limit_ragged: Optional[float] = Field(default=None, ge=0)
    verdict_rows: int = Field(0, ge=0)
    failed: bool = True
    """No verdict, or a verdict row that is incorrect or not ok."""
    device: Optional[str] = None
    """Device of that verdict (geomeans are compared only between iterations on one device)."""
    parent_commit: Optional[str] = None
    """HEAD before this iteration's commit."""
    branch: str = ""


@dataclass
class CommitResult:
    """What `kopt commit` / `kopt revert` did."""

    iteration: int
    message: str
    sha: str
    snapshot: Optional[Path] = None
    refreshed: list[Path] = field(default_factory=list)
    """Files regenerated into the commit: in kopt's own tree the package templates that changed, then the plots
    and report (kopt.report.refresh)."""
    warning: Optional[str] = None
    """Why they could not be regenerated, when they could not (the commit still goes ahead)."""


def candidate_hash(path: Path) -> tuple[Optional[str], Optional[str]]:
    """(kopt.candidate.content_hash of the candidate, candidate_id = its short id), or (None, None)
    when absent."""
    from kopt.candidate import content_hash, short_id

    try:
        h = content_hash(Path(path))
    except OSError:
        return None, None
    return h, short_id(h)


def slugify(text: str, limit: int = 40) -> str:
    """A folder-safe label: lowercase ascii words joined by '-'."""
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug[:limit].rstrip("-") or "iter"


def open_repo(ws: Path):
    """The git repository holding the workspace, or WorkspaceError."""
    import git

    try:
        return git.Repo(Path(ws), search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise WorkspaceError(f"{ws} is not a git repository: start a workspace with `kopt init DIR`") from None


def check_state(repo) -> None:
    """Refuse a detached HEAD or an operation in progress (merge, rebase, cherry-pick)."""
    if repo.head.is_detached:
        raise WorkspaceError("HEAD is detached: switch to a branch first (`git switch <branch>`)")
    gd = Path(repo.git_dir)
    for name, what in _STATE_FILES:
        if (gd / name).exists():
            raise WorkspaceError(f"{what} is in progress: finish or abort it before committing an iteration")


def pathspecs(repo, ws: Path, names=WORKSPACE_PATHS) -> list[str]:
    root = Path(repo.working_tree_dir).resolve()
    try:
        prefix = Path(ws).resolve().relative_to(root)
    except ValueError:
        raise WorkspaceError(f"workspace {ws} is outside its git repository {root}") from None
    return [(prefix / n).as_posix() for n in names]


def iteration_commits(repo) -> list[str]:
    """hexshas of the `[iter N]` commits reachable from HEAD, newest first ([] on an unborn branch)."""
    if not repo.head.is_valid():
        return []
    out = []
    for line in repo.git.log("--format=%H%x00%s", "HEAD").splitlines():
        sha, _, subject = line.partition("\0")
        if ITER_RE.match(subject):
            out.append(sha)
    return out


def iterations_done(repo) -> int:
    """Number of `[iter ` commits reachable from HEAD (0 on an unborn branch)."""
    return len(iteration_commits(repo))


def next_iteration(ws: Path, fallback: int = 1) -> int:
    """The number of the iteration being worked on (see the module rule); `fallback` outside git."""
    try:
        return iterations_done(open_repo(ws)) + 1
    except WorkspaceError:
        return fallback


def diff_stat(ws: Path) -> Optional[str]:
    """`git diff --stat` of the workspace paths since the last `[iter N]` commit (HEAD when there is
    none), working tree included: what this iteration changed, also when part of it was committed
    on its own before measuring; plus untracked files. None outside git."""
    try:
        repo = open_repo(ws)
    except WorkspaceError:
        return None
    specs = pathspecs(repo, ws)
    base = next(iter(iteration_commits(repo)), None) or ("HEAD" if repo.head.is_valid() else None)
    stat = repo.git.diff("--stat", base, "--", *specs) if base else ""
    new = repo.git.ls_files("--others", "--exclude-standard", "--", *specs).splitlines()
    lines = [stat] if stat else []
    lines += [f" {p} (new, untracked)" for p in new]
    return "\n".join(lines)


def snapshots(ws: Path) -> list[tuple[Path, SnapshotMeta]]:
    """Every readable trajectory snapshot, by iteration then name (unreadable ones are skipped)."""
    out = []
    root = Path(ws) / "trajectory"
    for d in root.iterdir() if root.is_dir() else ():
        if d.name.startswith(".") or not (d / "meta.json").is_file():
            continue
        try:
            out.append((d, SnapshotMeta.model_validate_json((d / "meta.json").read_text())))
        except ValueError:
            continue
    return sorted(out, key=lambda t: (t[1].iteration, t[0].name))


def _copy_solution(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*.swp"))


def _copy_tuning_tables(ws: Path, dst: Path) -> None:
    """results/<backend>/tuning.csv of the workspace into dst/results/<backend>/: a candidate that reads its
    tuned configs from the workspace (two folders above its own folder) finds, run from its snapshot, the
    table it was verified with instead of none."""
    for table in sorted((ws / "results").glob("*/tuning.csv")):
        target = dst / "results" / table.parent.name / table.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(table, target)


def write_snapshot(ws: Path, repo, n: int, description: str) -> Path:
    """Snapshot solution/, the tuning tables (results/*/tuning.csv), the latest verdict rows and entry N into
    trajectory/<N>-<stamp>-<label>/ atomically."""
    from kopt.paths import ledger_file
    from kopt.workspace import journal, ranking
    from kopt.workspace.ledger import load_dicts

    ws = Path(ws)
    now = datetime.now(timezone.utc)
    label = slugify(description)
    h, cid = candidate_hash(ws / CANDIDATE_REL)
    rows = ranking.latest_verdict(load_dicts(ledger_file(ws)).rows, cid) if cid else []
    g = ranking.geomeans(rows)
    meta = SnapshotMeta(iteration=n, label=label, description=description, created=now.isoformat(timespec="seconds"),
                        candidate_hash=h, candidate_id=cid, geomean=g.uniform, n_cases=g.n_uniform,
                        geomean_ragged=g.ragged, n_ragged=g.n_ragged, pct_limit=g.pct_limit,
                        pct_limit_ragged=g.pct_limit_ragged, verdict_rows=len(rows),
                        failed=ranking.failed(rows), device=ranking.verdict_device(rows),
                        branch=repo.active_branch.name,
                        parent_commit=repo.head.commit.hexsha if repo.head.is_valid() else None)
    traj = ws / "trajectory"
    traj.mkdir(exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{n}-", dir=traj))
    tmp.chmod(0o755)  # mkdtemp makes 0700; the snapshot is ordinary workspace content
    try:
        if (ws / "solution").is_dir():
            _copy_solution(ws / "solution", tmp / "solution")
        _copy_tuning_tables(ws, tmp)
        (tmp / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
        if (entry := journal.entry_text(ws, n)) is not None:
            (tmp / "iteration.md").write_text(entry)
        (tmp / "meta.json").write_text(meta.model_dump_json(indent=1) + "\n")
        final = traj / f"{n}-{now:%Y%m%dT%H%M%S}-{label}"
        k = 1
        while final.exists():  # two commits in one second: keep both
            final, k = traj / f"{n}-{now:%Y%m%dT%H%M%S}-{label}-{k}", k + 1
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def git_error(e) -> str:
    """The first meaningful line of a GitCommandError's stderr."""
    for ln in str(e.stderr or e).splitlines():
        ln = ln.strip().removeprefix("stderr:").strip().strip("'\"").strip()
        if ln:
            return ln
    return "git failed"


def commit(repo, message: str, specs: list[str]) -> str:
    """Stage `specs` (adds, edits, deletions) and commit exactly them; returns the new sha."""
    import git

    head = repo.head.is_valid()
    # A pathspec git knows nothing about is an error: keep those on disk, in the index or in HEAD.
    known = [s for s in specs if Path(repo.working_tree_dir, s).exists() or repo.git.ls_files("--", s)
             or (head and repo.git.ls_tree("--name-only", "HEAD", "--", s))]
    try:
        repo.git.add("-A", "--", *known)
        repo.git.commit("-m", message, "--", *known)
    except git.GitCommandError as e:
        raise WorkspaceError(f"git commit failed: {git_error(e)}") from None
    return repo.head.commit.hexsha


def changed(repo, specs: list[str]) -> bool:
    return bool(repo.git.status("--porcelain", "--untracked-files=all", "--", *specs).strip())


def _best_snapshot(ws: Path, snaps: list[tuple[Path, SnapshotMeta]]) -> tuple[Path, SnapshotMeta]:
    """The snapshot of the best-ranked candidate (geomean from the ledger) that has one."""
    from kopt.paths import ledger_file
    from kopt.workspace import ranking

    by_cid: dict[str, tuple[Path, SnapshotMeta]] = {}
    for p, m in snaps:
        if m.candidate_id:
            by_cid.setdefault(m.candidate_id, (p, m))  # the first iteration that committed it
    df, _ = ranking.load_frame(ledger_file(ws))
    for cid in ranking.rank(df)["candidate_id"]:
        if cid in by_cid:
            return by_cid[cid]
    raise WorkspaceError("no trajectory snapshot holds a candidate ranked in candidates.jsonl: "
                         "give an iteration number instead (`kopt revert N`)")


def revert(ws: Path, target: str = "best") -> CommitResult:
    """Restore solution/ from snapshot N (or the best candidate's) as a NEW commit `[revert] ...`."""
    repo = open_repo(ws)
    check_state(repo)
    snaps = [(p, m) for p, m in snapshots(ws) if (p / "solution").is_dir()]
    if not snaps:
        raise WorkspaceError("no trajectory snapshots yet: `kopt commit` records one per iteration")
    if target == "best":
        path, meta = _best_snapshot(ws, snaps)
    elif target.isdigit():
        found = [(p, m) for p, m in snaps if m.iteration == int(target)]
        if not found:
            have = ", ".join(str(m.iteration) for _, m in snaps)
            raise UsageError(f"no trajectory snapshot for iteration {target} (have: {have})")
        path, meta = found[-1]
    else:
        raise UsageError(f"revert target must be an iteration number or 'best', not {target!r}")
    specs = pathspecs(repo, ws, ("solution",))
    if changed(repo, specs):
        raise WorkspaceError("solution/ has uncommitted changes: commit them (`kopt commit`) or discard them first")
    sol = Path(ws) / "solution"
    shutil.rmtree(sol, ignore_errors=True)
    _copy_solution(path / "solution", sol)
    if not changed(repo, specs):
        raise WorkspaceError(f"solution/ already matches iteration {meta.iteration}: nothing to revert")
    message = f"[revert] solution from iter {meta.iteration}"
    return CommitResult(meta.iteration, message, commit(repo, message, specs), path)


def head_short(start: Path) -> Optional[str]:
    """Short commit of the workspace: $KOPT_COMMIT when set (a GPU host given a copy of the tree,
    whose own git metadata, if any, need not match what was copied), else the HEAD of the
    repository holding the candidate, with ``-dirty`` appended when the candidate's folder differs from that commit
    (a tracked file changed, or an untracked one beside it), so a row never names a commit whose code is not the
    code it timed; None outside a repository or for a folder that holds no tracked file (a copy of another
    commit's candidate unpacked into the tree)."""
    import subprocess

    pinned = os.environ.get("KOPT_COMMIT", "").strip()[:12]
    if pinned:
        return pinned

    def git(*args: str) -> str:
        try:
            p = subprocess.run(["git", *args], cwd=start, capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return p.stdout.strip() if p.returncode == 0 else ""

    head = git("rev-parse", "--short=12", "HEAD")
    if not head or not git("ls-files", "--", "."):
        return None
    if git("status", "--porcelain", "--", "."):
        head += "-dirty"
    return head


def export_candidate(ws: Path, cid: str, dst: Path, rel: str = "solution/tilelang/run_kernel.py",
                     limit: int = 200) -> Optional[Path]:
    """Candidate `cid` as git holds it: the newest of the last `limit` commits touching solution/ whose `rel`
    (with the sibling modules it imports) hashes to `cid`, written under dst with that commit's tuning
    tables (results/*/tuning.csv, which the candidate reads two folders above its own); the path of its
    file there, or None when no such commit is found (outside git too)."""
    import io
    import subprocess
    import tarfile

    try:
        repo = open_repo(ws)
    except WorkspaceError:
        return None
    root = Path(repo.working_tree_dir)
    sol, res = pathspecs(repo, ws, ["solution", "results"])
    if not repo.head.is_valid():
        return None
    for sha in repo.git.log(f"-{limit}", "--format=%H", "HEAD", "--", sol).splitlines():
        out = Path(dst) / sha[:12]
        names = [n for n in repo.git.ls_tree("-r", "--name-only", sha, "--", sol, res).splitlines()
                 if n.startswith(sol + "/") or n.endswith("/tuning.csv")]
        tar = subprocess.run(["git", "archive", "--format=tar", sha, "--", *names], cwd=root, capture_output=True)
        if tar.returncode != 0:
            continue
        with tarfile.open(fileobj=io.BytesIO(tar.stdout)) as t:
            t.extractall(out, filter="data")
        prefix = Path(sol).parent  # the workspace's folder inside the repository
        path = out / prefix / rel
        if path.is_file() and candidate_hash(path)[1] == cid:
            return path
        shutil.rmtree(out, ignore_errors=True)
    return None
