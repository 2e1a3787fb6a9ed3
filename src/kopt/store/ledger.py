"""All JSONL I/O: whole-line appends under a file lock; loads that report and skip torn lines."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, TypeVar

from pydantic import BaseModel, ValidationError

from kopt.errors import LedgerError
from kopt.store import lean

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
    """Yield (line number, line, row or None, why not) for every row line of ledger text, lean rows read back
    whole (kopt.store.lean)."""
    for no, line, obj, why in lean.decode(text):
        if obj is None:
            yield no, line, None, why
            continue
        try:
            yield no, line, model.model_validate(obj), ""
        except ValidationError as e:
            yield no, line, None, f"schema: {e.errors()[0]['msg']}"


def archive_dir(path: Path) -> Path:
    """Where the older generations of ledger `path` lie: candidates.jsonl -> candidates.archive/."""
    path = Path(path)
    return path.parent / f"{path.stem}.archive"


def generations(path: Path) -> list[Path]:
    """The archived generations of ledger `path`, oldest first (NNNN.jsonl.xz, never rewritten)."""
    d = archive_dir(path)
    return sorted(d.glob("[0-9]*.jsonl.xz"), key=lambda p: int(p.name.split(".")[0])) if d.is_dir() else []


_TEXTS: dict[tuple[str, int, int], str] = {}


def _archived_text(p: Path) -> str:
    """The text of one archived generation (decompressed once per process and version of the file)."""
    import lzma

    try:
        st = p.stat()
        key = (str(p), st.st_mtime_ns, st.st_size)
        if key not in _TEXTS:
            _TEXTS[key] = lzma.decompress(p.read_bytes()).decode(errors="replace")
        return _TEXTS[key]
    except (OSError, lzma.LZMAError) as e:
        raise LedgerError(f"cannot read ledger archive {p}: {e}") from None


def _texts(path: Path):
    """(name, text) of every part of ledger `path`: its archived generations, oldest first, then the file."""
    path = Path(path)
    for p in generations(path):
        yield f"{archive_dir(path).name}/{p.name}", _archived_text(p)
    if path.exists():
        try:
            yield "", path.read_text(errors="replace")
        except OSError as e:
            raise LedgerError(f"cannot read ledger {path}: {e.strerror or e}") from None


def load(model: type[M], path: Path) -> Loaded:
    """Load every valid row of a ledger (its archived generations first); malformed or torn lines are reported
    (line number; in an archive, its name in the reason), never fatal."""
    out = Loaded()
    for name, text in _texts(path):
        for no, _, row, why in _parse(model, text):
            if row is None:
                out.skipped.append((no, f"{name}: {why}" if name else why))
            else:
                out.rows.append(row)
    return out


def load_dicts(path: Path) -> Loaded:
    """Raw dict rows (any schema version), for tolerant readers such as the ranking; archived generations
    first, lean rows read back whole."""
    out = Loaded()
    for name, text in _texts(path):
        for no, _, row, why in lean.decode(text):
            if row is None:
                out.skipped.append((no, f"{name}: {why}" if name else why))
            else:
                out.rows.append(row)
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


#: A ledger file longer than this (bytes, lean) gives its older rows to a new archived generation...
ARCHIVE_AT = 1 << 20
#: ...and keeps about this many bytes of its newest rows.
KEEP = 256 << 10


@dataclass
class Compacted:
    """What `compact` did (or, dry, would do) to a ledger file."""

    rows: int = 0
    before: int = 0
    """Bytes of the file before, and after."""
    after: int = 0
    archived: int = 0
    """Rows moved into the new generation (none: 0)."""
    generation: Optional[Path] = None
    generation_bytes: int = 0
    changed: bool = False


def _items(text: str) -> list:
    """A ledger text as rows (dicts) and the lines that are no row (verbatim)."""
    return [row if row is not None else line for _, line, row, _ in lean.decode(text)]


def _key(item) -> str:
    return lean.dumps(item) if isinstance(item, dict) else item


def _lines_bytes(lines: list[str]) -> bytes:
    return "".join(line + "\n" for line in lines).encode(errors="surrogateescape")


def _checked(items: list) -> list[str]:
    """lean.encode(items), read back and compared with them first: LedgerError when a row would change."""
    lines = lean.encode(items)
    if [_key(i) for i in _items("\n".join(lines))] != [_key(i) for i in items]:
        raise LedgerError("the lean ledger would not read back as the rows it was made from: nothing written")
    return lines


def compact(path: Path, archive_at: Optional[int] = None, keep: Optional[int] = None,
            dry_run: bool = False) -> Compacted:
    """Store ledger `path` lean (kopt.store.lean: every row reads back the same, checked before anything is
    replaced); when it is still longer than `archive_at` bytes (ARCHIVE_AT), its older rows go to a new
    xz-compressed generation in archive_dir(path), never rewritten, and about `keep` bytes (KEEP) of the newest
    stay. Under the ledger's lock, so appends wait; each file is replaced atomically."""
    import lzma

    from kopt import atomic

    path, archive_at, keep = Path(path), archive_at or ARCHIVE_AT, keep or KEEP
    out = Compacted()
    if not path.is_file():
        return out
    with _lock(path):
        raw = path.read_bytes()
        items = _items(raw.decode(errors="surrogateescape"))
        gens = generations(path)
        if gens and items:  # a compaction cut short between its two files left the file whole: its head archived
            text = _archived_text(gens[-1])
            first = next((r if r is not None else line for _, line, r, _ in lean.decode(text)), None)
            done = [_key(i) for i in _items(text)] if first is not None and _key(first) == _key(items[0]) else []
            if done and [_key(i) for i in items[:len(done)]] == done:
                items = items[len(done):]
        out.rows, out.before = sum(isinstance(i, dict) for i in items), len(raw)
        lines = _checked(items)
        split = 0
        if sum(len(line) + 1 for line in lines) > archive_at:
            whole = [len(_key(i)) + 1 for i in items]
            budget = keep * sum(whole) / max(1, sum(len(line) + 1 for line in lines))  # lean bytes as whole ones
            split, tail = len(items), 0
            while split > 0 and tail + whole[split - 1] <= budget:
                split, tail = split - 1, tail + whole[split - 1]
        data = _lines_bytes(_checked(items[split:]) if split else lines)
        out.after, out.archived = len(data), sum(isinstance(i, dict) for i in items[:split])
        out.changed = data != raw
        if split:
            n = int(gens[-1].name.split(".")[0]) + 1 if gens else 1
            out.generation = archive_dir(path) / f"{n:04d}.jsonl.xz"
            packed = lzma.compress(_lines_bytes(_checked(items[:split])), preset=9 | lzma.PRESET_EXTREME)
            out.generation_bytes = len(packed)
        if dry_run or not out.changed:
            return out
        try:
            if split:  # the generation first: a crash before the file is replaced leaves rows twice, not none
                atomic.write_bytes(out.generation, packed)
            atomic.write_bytes(path, data)
        except OSError as e:
            raise LedgerError(f"cannot write ledger {path}: {e.strerror or e}") from None
    return out
