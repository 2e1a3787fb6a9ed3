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


def parse_ids(text: str | None, limit: int = 10_000) -> list[int] | None:
    """'1,3,5-7' -> [1, 3, 5, 6, 7]; None stays None; empty, reversed or huge ranges are usage errors."""
    if text is None:
        return None
    ids: list[int] = []
    bad = UsageError(f"invalid case list {text!r}: expected ids like 1,3,5-7")
    parts = [p.strip() for p in text.split(",")]
    if not any(parts):
        raise bad
    try:
        for part in parts:
            if not part:
                continue
            if "-" in part[1:]:
                a, b = (int(x) for x in part.split("-", 1))
                if b < a or b - a >= limit:
                    raise bad
                ids.extend(range(a, b + 1))
            else:
                ids.append(int(part))
            if len(ids) > limit:
                raise bad
    except ValueError:
        raise bad from None
    return ids


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
