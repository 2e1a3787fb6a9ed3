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
    return append_lines(path, (r.model_dump_json() for r in rows))


def append_lines(path: Path, lines: Iterable[str]) -> int:
    """Append JSON lines (each without its newline) verbatim, with one write under a lock; returns the number
    written."""
    path = Path(path)
    data = "".join(line + "\n" for line in lines).encode()
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


def _parse(model: type[M], text: str):
    """Yield (line number, line, row or None, why not) for every non-blank line of JSONL text."""
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield no, line, model.model_validate(json.loads(line)), ""
        except json.JSONDecodeError:
            yield no, line, None, "torn or invalid JSON"
        except ValidationError as e:
            yield no, line, None, f"schema: {e.errors()[0]['msg']}"


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
    for no, _, row, why in _parse(model, text):
        if row is None:
            out.skipped.append((no, why))
        else:
            out.rows.append(row)
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


@dataclass
class Imported:
    """What `import_rows` did: the rows appended, the rows already present (by row_id), the lines refused."""

    added: list = field(default_factory=list)
    present: int = 0
    skipped: list[tuple[int, str]] = field(default_factory=list)
    source: str = ""


def read_copy(path: Path) -> tuple[str, str]:
    """(text, name) of another copy of a ledger: a JSONL file, or a tar archive (.tgz, .tar.gz, .tar) holding
    exactly one member named candidates.jsonl (a campaign's logs). LedgerError (exit 2) for anything else."""
    import tarfile

    path = Path(path)
    if not path.is_file():
        raise LedgerError(f"no such file: {path}")
    if not tarfile.is_tarfile(path):
        try:
            return path.read_text(errors="replace"), str(path)
        except OSError as e:
            raise LedgerError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        with tarfile.open(path) as tar:
            members = [m for m in tar.getmembers() if m.isfile() and Path(m.name).name == "candidates.jsonl"]
            if len(members) != 1:
                raise LedgerError(f"{path}: want one candidates.jsonl in the archive, found {len(members)}")
            data = tar.extractfile(members[0]).read()
    except (tarfile.TarError, OSError) as e:
        raise LedgerError(f"cannot read archive {path}: {e}") from None
    return data.decode(errors="replace"), f"{path}:{members[0].name}"


def import_rows(model: type[M], dest: Path, path: Path, dry_run: bool = False) -> Imported:
    """Append to the ledger `dest` the rows of another copy of it (read_copy) whose row_id it does not hold,
    in their order, each line verbatim; lines that are not a valid row are refused and reported. With dry_run
    nothing is written."""
    text, name = read_copy(path)
    out = Imported(source=name)
    have = {r.get("row_id") for r in load_dicts(dest).rows}
    lines = []
    for no, line, row, why in _parse(model, text):  # the same reading as load()
        if row is None:
            out.skipped.append((no, why))
            continue
        if row.row_id in have:
            out.present += 1
            continue
        have.add(row.row_id)
        out.added.append(row)
        lines.append(line.strip())
    if out.skipped and not (out.added or out.present):
        no, why = out.skipped[0]
        raise LedgerError(f"{name}: not a ledger, no line is a row ({len(out.skipped)} refused; line {no}: {why})")
    if lines and not dry_run:
        append_lines(dest, lines)
    return out
