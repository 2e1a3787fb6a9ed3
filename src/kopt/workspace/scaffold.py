"""`kopt init DIR`: a new workspace from the package templates, as a git repo with one commit.

The templates (kopt/templates/) hold the text files; the empty ledger, ITERATIONS.md (the
journal's canonical empty document), .gitignore and the .gitkeep files are written from code so
they always match what the rest of kopt reads. Most templates are copies of the project's own
workspace files (SYNCED); `sync_templates(project_root)` refreshes them (`kopt commit` does, in kopt's own
source tree), and a test flags drift.
`--force` lets init use a non-empty folder; files that already exist there are kept, never
overwritten, and only the files init wrote are committed.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from kopt.errors import WorkspaceError

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
#: Project paths copied into the templates by sync_templates (the starter candidate is added with
#: the sibling modules it loads). README.md is the workspace's own, not the project's.
SYNCED = ("SKILL.md", "HINTS.md", "bench/cases.yaml", "knowledge", "workflows/prompts")


@dataclass
class InitResult:
    """What `kopt init` created."""

    path: Path
    created: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    sha: str = ""


def _template_files() -> dict[str, Path]:
    """Relative path -> template file, caches excluded."""
    from kopt.paths import TEMPLATES

    return {p.relative_to(TEMPLATES).as_posix(): p for p in sorted(TEMPLATES.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


def _generated() -> dict[str, str]:
    """Files written from code: relative path -> text."""
    from kopt.workspace.journal import render

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
        from kopt.workspace.vcs import git_error

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
    root.mkdir(parents=True, exist_ok=True)
    res = InitResult(root)
    # template files are copied, generated ones written; an existing file is kept either way
    for rel, content in [*_template_files().items(), *_generated().items()]:
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


def starter_files(solution_dir: Path) -> list[Path]:
    """run_kernel.py plus every sibling module it imports (transitively) in solution/tilelang/: the
    files its candidate id covers (kopt.candidate.sources)."""
    from kopt.candidate import sources

    main = Path(solution_dir) / "run_kernel.py"
    return sources(main) if main.is_file() else []


def synced_sources(root: Path) -> dict[str, Path]:
    """Relative template path -> project file, for everything sync_templates copies."""
    root = Path(root)
    out: dict[str, Path] = {}
    for rel in SYNCED:
        src = root / rel
        files = sorted(f for f in src.rglob("*.md")) if src.is_dir() else [src] if src.is_file() else []
        out.update({f.relative_to(root).as_posix(): f for f in files})
    for f in starter_files(root / "solution" / "tilelang"):
        out[f.relative_to(root).as_posix()] = f
    return out


#: Where kopt's own source tree keeps the package templates, relative to its root (the project's workspace).
OWN_TEMPLATES = "src/kopt/templates"


def own_templates(ws: Path) -> Path | None:
    """ws / OWN_TEMPLATES when the workspace is kopt's own source tree (the package runs from ws/src/kopt, an
    editable install), else None: only there do the templates follow the workspace files."""
    from kopt.paths import TEMPLATES

    here = Path(ws).resolve() / OWN_TEMPLATES
    return here if here.is_dir() and here == TEMPLATES.resolve() else None


def sync_templates(root: Path) -> list[str]:
    """Copy the project's workspace files into kopt/templates (a maintainer step); returns what changed."""
    from kopt.paths import TEMPLATES

    changed = []
    sources = synced_sources(root)
    starter = TEMPLATES / "solution" / "tilelang"
    for old in starter.glob("*.py"):  # the starter set may shrink: a starter file the project no longer has goes
        rel = old.relative_to(TEMPLATES).as_posix()
        if rel not in sources:
            old.unlink()
            changed.append(rel)
    for rel, src in sources.items():
        dst = TEMPLATES / rel
        if not dst.exists() or dst.read_bytes() != src.read_bytes():
            changed.append(rel)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
    return changed
