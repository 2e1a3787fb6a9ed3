"""`kopt init DIR`: a new workspace from the workspace template, as a git repo with one commit.

The template's files (kopt.template: the project's own SKILL.md, knowledge/, starter kernel ..., read where they
are shipped, and the template-only README) are copied; the empty ledger, ITERATIONS.md (the journal's canonical
empty document), .gitignore and the .gitkeep files are written from code so they always match what the rest of
kopt reads.
`--force` lets init use a non-empty folder; files that already exist there are kept, never
overwritten, and only the files init wrote are committed.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from kopt.errors import KoptError, WorkspaceError

GITIGNORE = """\
__pycache__/
*.py[cod]
.venv/
# ledger lock files and half-written snapshots
*.lock
trajectory/.tmp-*
# large profiler outputs: keep summaries in results/, not raw traces
*.ncu-rep
*.nsys-rep
*.qdrep
*.sqlite
# raw profiler logs record the host's paths: summary.md / summary.json are what results/ keeps
results/**/profiling/**/*.log
# the report's screenshot (kopt report --screenshot) is for looking at: report.html is the committed view
results/**/report.png
"""
KEEP = ("results/.gitkeep", "trajectory/.gitkeep", "scripts/.gitkeep")
INIT_MESSAGE = "kopt init"


@dataclass
class InitResult:
    """What `kopt init` created."""

    path: Path
    created: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    sha: str = ""


def _generated() -> dict[str, str]:
    """Files written from code: relative path -> text."""
    from kopt.store.journal import render

    files = {"ITERATIONS.md": render([]), "candidates.jsonl": "", ".gitignore": GITIGNORE}
    files.update({k: "" for k in KEEP})
    return files


def _git_commit(root: Path, paths: list[str]) -> str:
    """git init (unless root already is a repository's top) and commit `paths` as 'kopt init'."""
    import git

    try:
        repo = git.Repo(root)
    except git.InvalidGitRepositoryError:
        try:
            repo = git.Repo.init(root, initial_branch="main")
        except git.GitCommandError:  # git older than 2.28 has no --initial-branch
            repo = git.Repo.init(root)
    if not paths:
        return repo.head.commit.hexsha if repo.head.is_valid() else ""
    try:
        repo.git.add("--", *paths)
        repo.git.commit("-m", INIT_MESSAGE, "--", *paths)
    except git.GitCommandError as e:
        from kopt.store.vcs import git_error

        raise WorkspaceError(f"workspace written but the first commit failed ({git_error(e)}): "
                             f"fix git (user.name/user.email?) and run `git commit` in {root}") from None
    return repo.head.commit.hexsha


def init_workspace(target: Path, force: bool = False) -> InitResult:
    """Scaffold a workspace in `target` (empty, or any folder with force), git init, first commit."""
    root = Path(target).expanduser().resolve()
    if root.exists() and not root.is_dir():
        raise WorkspaceError(f"{target} exists and is not a folder")
    if root.is_dir() and any(root.iterdir()) and not force:
        raise WorkspaceError(f"{target} is not empty: pick a new folder, or pass --force (existing files are kept)")
    from kopt import template

    try:
        copied = template.files()
    except FileNotFoundError as e:
        raise KoptError(f"kopt's workspace template is incomplete: {e}") from None
    root.mkdir(parents=True, exist_ok=True)
    res = InitResult(root)
    # template files are copied, generated ones written; an existing file is kept either way
    for rel, content in [*copied.items(), *_generated().items()]:
        dst = root / rel
        if dst.exists():
            res.kept.append(rel)
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            shutil.copyfile(content, dst)
        else:
            dst.write_text(content)
        res.created.append(rel)
    res.sha = _git_commit(root, res.created)
    return res
