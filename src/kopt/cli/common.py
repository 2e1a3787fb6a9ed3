"""Shared CLI helpers: console on stderr, option parsing helpers."""

from __future__ import annotations

from kopt.errors import UsageError


def err_console():
    """A rich console on stderr (logs and progress never go to stdout)."""
    from rich.console import Console

    return Console(stderr=True)


#: Columns of stdout when it is no terminal (a pipe, a file, an agent): wide enough that rich never wraps or
#: truncates a table's ids and numbers (it would cut them at 80 columns).
PIPE_WIDTH = 10_000


def out_console():
    """A rich console on stdout for tables: the terminal's width, or PIPE_WIDTH when stdout is not a terminal."""
    from rich.console import Console

    class PipeConsole(Console):
        def on_broken_pipe(self) -> None:  # the reader left (`| head`): kopt's main exits quietly (141)
            self.quiet = True
            raise BrokenPipeError

    c = PipeConsole()
    return c if c.is_terminal else PipeConsole(width=PIPE_WIDTH)


def edit_text(text: str, suffix: str = ".md") -> str | None:
    """Open $VISUAL / $EDITOR (else vi) on `text` in a temp file; the edited text, or None if it failed."""
    import os
    import shlex
    import subprocess
    import tempfile

    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    fd, name = tempfile.mkstemp(suffix=suffix, prefix="kopt-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        if subprocess.call([*shlex.split(editor), name]) != 0:
            return None
        with open(name) as f:
            return f.read()
    except OSError as e:
        raise UsageError(f"cannot run the editor {editor!r}: {e.strerror or e}") from None
    finally:
        os.unlink(name)
