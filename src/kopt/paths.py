"""Where the workspace is: the folder holding bench/cases.yaml, found from the cwd upwards."""

from __future__ import annotations

import os
from pathlib import Path

#: Environment variable that pins the workspace (tests point it at a tmp dir).
ENV_WORKSPACE = "KOPT_WORKSPACE"


def cache_home(env: dict | None = None) -> Path:
    """kopt's own cache folder under `env` (default: this process's environment): $XDG_CACHE_HOME/kopt, else
    ~/.cache/kopt. Standard library only (kopt.bytecode reads it before kopt's other imports)."""
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".cache")
    return Path(base) / "kopt"


def workspace(start: Path | None = None) -> Path:
    """Return the workspace root: $KOPT_WORKSPACE, else the nearest parent holding bench/cases.yaml, else cwd.
    $KOPT_WORKSPACE naming no folder is a usage error: nothing is created there."""
    env = os.environ.get(ENV_WORKSPACE)
    if env:
        p = Path(env).expanduser().resolve()
        if not p.is_dir():
            from kopt.errors import WorkspaceError

            why = "is not a folder" if p.exists() else "does not exist"
            raise WorkspaceError(f"${ENV_WORKSPACE}={env} {why} (kopt init DIR makes a workspace)")
        return p
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / "bench" / "cases.yaml").is_file():
            return d
    return here


def find_workspace(start: Path | None = None) -> Path | None:
    """$KOPT_WORKSPACE, else the nearest folder from `start` (the cwd) upwards holding bench/cases.yaml; None
    when there is none."""
    env = os.environ.get(ENV_WORKSPACE)
    if env:
        return Path(env).resolve()
    here = (start or Path.cwd()).resolve()
    return next((d for d in (here, *here.parents) if (d / "bench" / "cases.yaml").is_file()), None)


def require_workspace() -> Path:
    """The workspace, or WorkspaceError (exit 2) naming the fix when the cwd is in none."""
    from kopt.errors import WorkspaceError

    ws = find_workspace()
    if ws is None:
        raise WorkspaceError(f"not in a kopt workspace: no bench/cases.yaml in {Path.cwd()} or above; start one with "
                             "`kopt init DIR` and cd into it (or set KOPT_WORKSPACE)")
    return ws


def cases_file(root: Path | None = None) -> Path:
    """The case matrix of the workspace, or the shipped one (kopt.template) when the workspace has none."""
    from kopt import template

    p = (root or workspace()) / "bench" / "cases.yaml"
    return p if p.is_file() else template.file("bench/cases.yaml")


def ledger_file(root: Path | None = None) -> Path:
    """candidates.jsonl of the workspace."""
    return (root or workspace()) / "candidates.jsonl"


#: The shipped candidate, relative to the workspace root.
CANDIDATE_REL = "solution/tilelang/run_kernel.py"


def default_candidate(root: Path | None = None) -> Path:
    """The shipped candidate of the workspace."""
    return (root or workspace()) / CANDIDATE_REL


def recorded(p: Path | str, root: Path | None = None) -> str:
    """How a row names a file (a candidate's path): relative to the workspace inside it; a copy kopt made in its own
    cache (a patched or revision candidate) or in the temporary folder (the reigning candidate a verdict pairs) as
    ``<kopt cache>/...`` or ``<tmp>/...``, so no row carries the host's home or temporary path; else as given."""
    import tempfile

    path = Path(p).resolve()
    for label, base in (("", root or workspace()), ("<kopt cache>/", cache_home()),
                        ("<tmp>/", Path(tempfile.gettempdir()))):
        try:
            return label + path.relative_to(Path(base).resolve()).as_posix()
        except ValueError:
            continue
    return str(p)


def relative(p: Path | str, root: Path | None = None) -> str:
    """p relative to the workspace (or root) when inside it, else p as given: rows and summaries
    name workspace files without a host path."""
    base = (root or workspace()).resolve()
    try:
        return str(Path(p).resolve().relative_to(base))
    except ValueError:
        return str(p)
