"""Git for the loop (GitPython, imported lazily): `[iter N]` commits, the commits of `kopt revert`
(kopt.workspace.revert).

Iteration numbering rule (one rule, used by `kopt log`, `kopt commit` and `kopt status`):
N = 1 + the number of commits reachable from HEAD whose subject starts with `[iter `.
Git history is the source of truth and kopt never rewrites it, so numbers are stable; `[revert]`
and hand-made commits do not count, and two commits that start with one `[iter N]` are refused
(iterations_done), never counted twice. Outside a git repository `kopt log` falls back to
"last ITERATIONS.md entry + 1".

Only the workspace paths are ever staged, and commits are made with an explicit pathspec
(`git commit -- <paths>`), so an unrelated file stays out even if it was staged by hand.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from kopt.errors import WorkspaceError

WORKSPACE_PATHS = ("solution", "results", "ITERATIONS.md", "candidates.jsonl", "candidates.archive", "trajectory",
                   "knowledge")
#: The file at the top of a lean copy of the workspace (kopt pack) naming the commit it was copied from.
COPIED_FROM = ".kopt-commit"
ITER_RE = re.compile(r"^\[iter (\d+)\]")
#: the subject of the commit `kopt revert` makes (workspace.revert)
REVERT_PREFIX = "[revert] "
_STATE_FILES = (("MERGE_HEAD", "a merge"), ("CHERRY_PICK_HEAD", "a cherry-pick"), ("REVERT_HEAD", "a git revert"),
                ("rebase-merge", "a rebase"), ("rebase-apply", "a rebase or git am"))


@dataclass
class CommitResult:
    """What `kopt commit` / `kopt revert` did."""

    iteration: int
    message: str
    sha: str
    snapshot: Optional[Path] = None
    refreshed: list[Path] = field(default_factory=list)
    """Files regenerated into the commit: the plots and report (kopt.report.refresh)."""
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


def _subjects(repo):
    """(hexsha, subject) of the commits reachable from HEAD, newest first (none on an unborn branch)."""
    if not repo.head.is_valid():
        return
    for line in repo.git.log("--format=%H%x00%s", "HEAD").splitlines():
        sha, _, subject = line.partition("\0")
        yield sha, subject


def iteration_commits(repo) -> list[str]:
    """hexshas of the `[iter N]` commits reachable from HEAD, newest first ([] on an unborn branch)."""
    return [sha for sha, subject in _subjects(repo) if ITER_RE.match(subject)]


def iterations_done(repo) -> int:
    """Number of `[iter ` commits reachable from HEAD (0 on an unborn branch). Two of them with one number are a
    WorkspaceError: a commit of other files whose subject starts with `[iter N]` would shift every later number by
    one (the count is the rule), so it is named instead of counted."""
    seen: dict = {}
    for sha, subject in _subjects(repo):
        m = ITER_RE.match(subject)
        if m:
            seen.setdefault(int(m.group(1)), []).append(sha[:7])
    twice = {n: shas for n, shas in seen.items() if len(shas) > 1}
    if twice:
        n, shas = min(twice.items())
        raise WorkspaceError(f"commits {' and '.join(shas)} both start with [iter {n}]: only `kopt commit` writes "
                             f"that prefix; reword the other one (git commit --amend, or git rebase -i)")
    return sum(len(shas) for shas in seen.values())


def next_iteration(ws: Path, fallback: int = 1) -> int:
    """The number of the iteration being worked on (see the module rule); `fallback` outside git."""
    try:
        repo = open_repo(ws)
    except WorkspaceError:
        return fallback
    return iterations_done(repo) + 1


def iteration_base(repo) -> Optional[str]:
    """The commit an iteration's changes count from: the newest `[iter N]` or `[revert]` commit reachable from HEAD
    (a revert puts solution/ back to an earlier iteration, and the next one starts from there), else HEAD; None on an
    unborn branch."""
    if not repo.head.is_valid():
        return None
    return next((sha for sha, subject in _subjects(repo)
                 if ITER_RE.match(subject) or subject.startswith(REVERT_PREFIX)), "HEAD")


def diff_stat(ws: Path) -> Optional[str]:
    """`git diff --stat` of the workspace paths since the iteration's base (iteration_base: the last `[iter N]` or
    `[revert]` commit), working tree included: what this iteration changed, also when part of it was committed on its
    own before measuring; plus untracked files. None outside git."""
    try:
        repo = open_repo(ws)
    except WorkspaceError:
        return None
    specs = pathspecs(repo, ws)
    base = iteration_base(repo)
    stat = repo.git.diff("--stat", base, "--", *specs) if base else ""
    new = repo.git.ls_files("--others", "--exclude-standard", "--", *specs).splitlines()
    lines = [stat] if stat else []
    lines += [f" {p} (new, untracked)" for p in new]
    return "\n".join(lines)


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


def head_short(start: Path) -> Optional[str]:
    """Short commit of the workspace: $KOPT_COMMIT when set (a GPU host given a copy of the tree,
    whose own git metadata, if any, need not match what was copied), else the HEAD of the
    repository holding the candidate (in a lean copy made by `kopt pack`, the commit its COPIED_FROM file
    names), with ``-dirty`` appended when the candidate's folder differs from that commit
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
    top = git("rev-parse", "--show-toplevel")
    if top and (Path(top) / COPIED_FROM).is_file():  # a lean copy (kopt pack): the commit it was copied from
        head = (Path(top) / COPIED_FROM).read_text().strip()[:18] or head
    if git("status", "--porcelain", "--", ".") and not head.endswith("-dirty"):
        head += "-dirty"
    return head


def export_candidate(ws: Path, cid: str, dst: Path, rel: str = "solution/tilelang/run_kernel.py",
                     limit: int = 200) -> Optional[Path]:
    """Candidate `cid` as git holds it: the newest of the last `limit` commits touching solution/ whose `rel`
    (with the sibling modules it imports) hashes to `cid`, written under dst with that commit's tuning
    tables (results/*/tuning.csv, which the candidate reads two folders above its own); the path of its
    file there, or None when no such commit is found (outside git too)."""
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
        if not _archive(root, sha, names, out):
            continue
        prefix = Path(sol).parent  # the workspace's folder inside the repository
        path = out / prefix / rel
        if path.is_file() and candidate_hash(path)[1] == cid:
            return path
        shutil.rmtree(out, ignore_errors=True)
    return None


def _archive(root: Path, sha: str, names: list[str], out: Path) -> bool:
    """Files `names` (paths from the repository's top) as commit `sha` holds them, written under `out`; False where
    git cannot archive them."""
    import io
    import subprocess
    import tarfile

    tar = subprocess.run(["git", "archive", "--format=tar", sha, "--", *names], cwd=root, capture_output=True)
    if tar.returncode != 0:
        return False
    with tarfile.open(fileobj=io.BytesIO(tar.stdout)) as t:
        t.extractall(out, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return True


def export_revision(ws: Path, rev: str, rel: str, cache: Path) -> Path:
    """The file `rel` (a path from the repository's top) as revision `rev` (a commit, branch or tag) of the workspace's
    repository holds it, with the rest of its folder and that commit's tuning tables (results/*/tuning.csv, which a
    candidate reads two folders above its own), exported once under cache/<commit>/; the file's path there.
    WorkspaceError: `rev` is not a commit, or it has no `rel`."""
    from git import GitCommandError

    repo = open_repo(ws)
    root = Path(repo.working_tree_dir)
    try:
        sha = repo.git.rev_parse("--verify", "--quiet", f"{rev}^{{commit}}").strip() if rev else ""
    except GitCommandError:  # not a revision
        sha = ""
    if not sha:
        raise WorkspaceError(f"{rev!r} is not a commit of the repository at {root}")
    out = Path(cache) / sha
    if (out / rel).is_file():  # exported before: the commit's tree is not listed again
        return (out / rel).resolve()
    names = repo.git.ls_tree("-r", "--name-only", sha).splitlines()
    if rel not in names:
        raise WorkspaceError(f"commit {sha[:12]} has no file {rel!r}")
    folder = Path(rel).parent.as_posix()
    (res,) = pathspecs(repo, ws, ["results"])
    take = [n for n in names if n.startswith(folder + "/") or (n.startswith(res + "/") and n.endswith("/tuning.csv"))]

    def fill(tmp: Path) -> None:
        if not _archive(root, sha, take, tmp):
            raise WorkspaceError(f"git archive of {sha[:12]} failed")

    # an export of this commit may be there (another folder of it, or another process's): add to it
    _export_once(Path(cache), out, f".{sha[:12]}-", fill, merge=True)
    return (out / rel).resolve()


def _export_once(cache: Path, out: Path, prefix: str, fill, merge: bool) -> None:
    """Fill a fresh folder of `cache` (fill(folder)) and move it to `out` in one rename, so no reader sees a half
    export; where `out` appeared meanwhile, add to it (`merge`) or keep it as it is (the same content, another
    process's). The fresh folder is removed whatever happens."""
    import tempfile

    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=cache))
    try:
        fill(tmp)
        try:
            os.replace(tmp, out)
        except OSError:
            if merge:
                shutil.copytree(tmp, out, dirs_exist_ok=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _patch_paths(patch: Path) -> list[str]:
    """The files a unified diff (`git diff`'s, paths from the repository's top) touches, as `git apply --numstat`
    reads them. WorkspaceError: git cannot read it as a patch, or it touches no file."""
    import subprocess

    r = subprocess.run(["git", "apply", "--numstat", str(patch)], capture_output=True, text=True,
                       cwd=Path(patch).parent, env=_outside_repos(Path(patch).parent))
    names = [ln.split("\t", 2)[2] for ln in r.stdout.splitlines() if ln.count("\t") >= 2]
    if r.returncode != 0 or not names:
        why = (r.stderr.strip().splitlines() or ["it changes no file"])[0]
        raise WorkspaceError(f"{patch} is not a patch git can apply: {why}")
    return names


def _outside_repos(cwd: Path) -> dict:
    """The environment for a git command that must treat `cwd` as a plain folder, not part of a repository above it
    (git apply then patches the files under cwd)."""
    return {**os.environ, "GIT_CEILING_DIRECTORIES": str(Path(cwd).resolve().parent)}


def export_patched(ws: Path, patch: Path, rel: str, cache: Path) -> Path:
    """The candidate file `rel` (a path from the workspace's top) as the working tree holds it, with the rest of its
    folder and the workspace's tuning tables (results/*/tuning.csv), and the unified diff `patch` applied to that
    copy, exported once under cache/<digest of the patch and the copied files>/; the file's path there. The workspace
    itself is never touched. WorkspaceError: the patch touches a file outside the candidate's folder, or does not
    apply to it."""
    import hashlib
    import subprocess

    ws, patch = Path(ws).resolve(), Path(patch).resolve()
    folder = Path(rel).parent.as_posix()
    outside = [n for n in _patch_paths(patch) if not n.startswith(folder + "/")]
    if outside:
        raise WorkspaceError(f"{patch.name} touches {', '.join(outside)}: a candidate's patch changes files of its "
                             f"folder {folder}/ only")
    files = sorted(p for p in (ws / folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    files += sorted((ws / "results").glob("*/tuning.csv"))
    h = hashlib.sha256(patch.read_bytes())
    for f in files:
        h.update(f.relative_to(ws).as_posix().encode() + b"\0" + f.read_bytes())
    out = Path(cache) / h.hexdigest()[:16]
    if (out / rel).is_file():  # exported before: the same patch over the same files
        return (out / rel).resolve()

    def fill(tmp: Path) -> None:
        for f in files:
            dst = tmp / f.relative_to(ws)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dst)
        r = subprocess.run(["git", "apply", "--whitespace=nowarn", str(patch)], cwd=tmp, capture_output=True,
                           text=True, env=_outside_repos(tmp))
        if r.returncode != 0:
            why = (r.stderr.strip().splitlines() or [f"git apply exited {r.returncode}"])[0]
            raise WorkspaceError(f"{patch.name} does not apply to {folder}/ as the working tree holds it: {why}")

    # another process that exported the same patch meanwhile made the same copy: keep its
    _export_once(Path(cache), out, ".patched-", fill, merge=False)
    return (out / rel).resolve()


def resolve_candidate(spec: Path | str, ws: Optional[Path] = None) -> Path:
    """A candidate spec as a file: a path (kopt.candidate.resolve); `REV:PATH` (git's spelling, e.g.
    next/row-warps:solution/tilelang/run_kernel.py; PATH from the repository's top) where no such file exists: the
    file as commit REV of the workspace's repository holds it, with its folder and the commit's tuning tables beside
    it, exported once into kopt's cache (revisions/<commit>/), so its candidate id is that commit's; or a patch file
    (`*.patch` / `*.diff`, as `git diff` writes it): the shipped candidate's folder as the working tree holds it with
    the patch applied, exported once into kopt's cache (patched/<digest>/). A REV that is not a commit, a commit
    without PATH, or a patch that touches another folder or does not apply is a usage error."""
    from kopt import paths
    from kopt.candidate import is_patch, is_revision, resolve
    from kopt.errors import UsageError

    if is_patch(spec):
        root = ws or paths.workspace()
        rel = paths.default_candidate(root).relative_to(root).as_posix()
        try:
            return resolve(export_patched(root, Path(spec), rel, paths.cache_home() / "patched"))
        except WorkspaceError as e:
            raise UsageError(f"candidate {spec}: {e}") from None
    if not is_revision(spec):
        return resolve(spec)
    rev, _, rel = str(spec).partition(":")
    try:
        return resolve(export_revision(ws or paths.workspace(), rev, rel.lstrip("/"), paths.cache_home() / "revisions"))
    except WorkspaceError as e:
        raise UsageError(f"candidate {spec}: {e}") from None
