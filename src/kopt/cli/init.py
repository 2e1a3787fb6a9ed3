"""`kopt init DIR`: scaffold a new workspace, git init, first commit."""

from __future__ import annotations

from pathlib import Path

import typer


def command(
    directory: Path = typer.Argument(..., help="Folder for the new workspace (created if missing)."),
    force: bool = typer.Option(False, "--force", help="Use a non-empty folder; existing files are kept."),
) -> None:
    """Create a workspace (README, SKILL, bench/cases.yaml, solution/, ledger, ITERATIONS.md...) as a git repo."""
    from kopt.workspace.scaffold import init_workspace

    res = init_workspace(directory, force=force)
    print(f"initialized kopt workspace in {res.path} ({len(res.created)} files"
          + (f", {len(res.kept)} kept" if res.kept else "") + f"), commit {res.sha[:10] or 'none'}")
