"""Atomic file writes: readers see the old text or the new, never half of it (temp file, then rename)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_text(path: Path, text: str, fsync: bool = True, newline: str | None = None) -> Path:
    """Write `text` to `path` through a temp file in the same folder and os.replace.

    fsync=False for files only a crashing *process* must not tear (e.g. a child's result.json),
    where paying for a disk flush on every write would slow the hot path.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline=newline) as f:
            f.write(text)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_bytes(path: Path, data: bytes, mode: int = 0o644) -> Path:
    """Write `data` to `path` through a temp file in the same folder, fsync'd, and os.replace; the file gets
    `mode` (a temp file is made 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
