"""Shared CLI helpers: console on stderr, option parsing helpers."""

from __future__ import annotations

from kopt.errors import UsageError


def err_console():
    """A rich console on stderr (logs and progress never go to stdout)."""
    from rich.console import Console

    return Console(stderr=True)


def out_console():
    """A rich console on stdout for tables."""
    from rich.console import Console

    return Console()


def parse_ids(text: str | None) -> list[int] | None:
    """'1,3,5-7' -> [1, 3, 5, 6, 7]; None stays None."""
    if not text:
        return None
    ids: list[int] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                a, b = part.split("-", 1)
                ids.extend(range(int(a), int(b) + 1))
            elif part:
                ids.append(int(part))
    except ValueError:
        raise UsageError(f"invalid case list {text!r}: expected ids like 1,3,5-7") from None
    return ids
