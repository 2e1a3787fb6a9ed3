"""All JSONL I/O: whole-line appends under a file lock; loads that report and skip torn lines."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from kopt.errors import LedgerError

M = TypeVar("M", bound=BaseModel)


def _lock(path: Path):
    from filelock import FileLock

    return FileLock(str(path) + ".lock", timeout=30)


def append(path: Path, rows: Iterable[BaseModel]) -> int:
    """Append rows as whole lines with one write under a lock; returns the number written."""
    path = Path(path)
    data = "".join(r.model_dump_json() + "\n" for r in rows).encode()
    if not data:
        return 0
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with _lock(path):
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                # A torn last line (a writer killed mid-append) must not swallow our first row.
                if os.fstat(fd).st_size and _last_byte(path) != b"\n":
                    data = b"\n" + data
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
    except OSError as e:
        raise LedgerError(f"cannot write ledger {path}: {e.strerror or e}") from None
    return data.count(b"\n")


def check_writable(path: Path) -> None:
    """Fail early (LedgerError, exit 2) when rows could not be appended, before any work is done."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab"):
            pass
    except OSError as e:
        raise LedgerError(f"cannot write ledger {path}: {e.strerror or e}") from None


def _last_byte(path: Path) -> bytes:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1)


@dataclass
class Loaded:
    """Rows that validated, plus the line numbers (1-based) and reasons of those that did not."""

    rows: list = field(default_factory=list)
    skipped: list[tuple[int, str]] = field(default_factory=list)


def load(model: type[M], path: Path) -> Loaded:
    """Load every valid row of a JSONL file; malformed or torn lines are reported, never fatal."""
    out = Loaded()
    path = Path(path)
    if not path.exists():
        return out
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        raise LedgerError(f"cannot read ledger {path}: {e.strerror or e}") from None
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.rows.append(model.model_validate(json.loads(line)))
        except json.JSONDecodeError:
            out.skipped.append((no, "torn or invalid JSON"))
        except ValidationError as e:
            out.skipped.append((no, f"schema: {e.errors()[0]['msg']}"))
    return out


def load_dicts(path: Path) -> Loaded:
    """Raw dict rows (any schema version), for tolerant readers such as the ranking."""
    out = Loaded()
    path = Path(path)
    if not path.exists():
        return out
    for no, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError
            out.rows.append(row)
        except ValueError:
            out.skipped.append((no, "torn or invalid JSON"))
    return out
