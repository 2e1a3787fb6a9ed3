"""`kopt log`: append the iteration's entry to ITERATIONS.md (Changes from git, Bench from the ledger)."""

from __future__ import annotations

import sys
from typing import Optional

import typer


def command(
    title: Optional[str] = typer.Option(None, "--title", help="Entry title (default: the hypothesis' first line)."),
    hypothesis: Optional[str] = typer.Option(None, "--hypothesis", help="What you expected and why."),
    analysis: Optional[str] = typer.Option(None, "--analysis", help="What the numbers say."),
    next_: Optional[str] = typer.Option(None, "--next", help="What to try next."),
    replace: bool = typer.Option(False, "--replace", help="Rewrite the logged, not yet committed entry."),
) -> None:
    """Append `## Iteration N — title` to ITERATIONS.md; with no flags in a terminal, write it in $EDITOR."""
    from kopt.errors import UsageError
    from kopt.paths import workspace
    from kopt.workspace import log

    edit = None
    if not any((title, hypothesis, analysis, next_)):
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            raise UsageError("give --hypothesis/--analysis/--next/--title (no terminal to open $EDITOR in)")
        from kopt.cli import common

        edit = common.edit_text
    entry = log.log_iteration(workspace(), title=title, hypothesis=hypothesis, analysis=analysis,
                              next_=next_, replace=replace, edit=edit)
    print(f"logged iteration {entry.number} — {entry.title} (ITERATIONS.md)")
