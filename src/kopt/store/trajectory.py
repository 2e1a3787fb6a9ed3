"""trajectory/: one snapshot per committed iteration, holding what git history does not give cheaply.

A snapshot, trajectory/<N>-<stamp>-<label>/, holds:

- meta.json (SnapshotMeta): the iteration, its candidate, the geomeans of its verdict, the ids of the verdict's
  rows (the rows themselves are in the ledger) and the sha256 of every file of the iteration;
- iteration.md: entry N of ITERATIONS.md;
- the iteration's files, solution/ and the tuning tables the candidate reads (results/*/tuning.csv), either
  whole, in those folders (the first snapshot, and one whose chain of deltas since the last whole one would
  outgrow the files themselves), or as files.json: a delta (kopt.store.delta) against the snapshot that
  meta.base names.

`files` rebuilds any snapshot's files byte for byte and checks them against meta.files; `kopt revert` restores
solution/ from them. Snapshots written before schema 2 hold their files whole and a results.json copy of
their verdict rows; `migrate` stores them lean (`kopt compact`), each checked to restore as before.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, Field

from kopt.errors import WorkspaceError
from kopt.paths import CANDIDATE_REL
from kopt.store import delta

DELTA = "files.json"
_SKIP = re.compile(r"(^|/)(__pycache__/|[^/]*\.pyc$|\.[^/]*\.swp$)")


class SnapshotMeta(BaseModel):
    """trajectory/<N>-<stamp>-<label>/meta.json: what one iteration committed and how it measured."""

    schema_version: int = 2
    """2: files whole or as a delta (base), verdict rows by id; 1: files whole, a results.json copy of the rows."""
    iteration: int = Field(ge=1)
    label: str
    description: str
    created: str
    """UTC time of the snapshot, ISO 8601."""
    candidate_path: str = CANDIDATE_REL
    candidate_hash: Optional[str] = None
    """sha256 of the candidate file's bytes (the bench's candidate_hash); None when absent."""
    candidate_id: Optional[str] = None
    """First 12 hex of candidate_hash: the key into candidates.jsonl."""
    geomean: Optional[float] = Field(default=None, gt=0)
    """Geomean speedup of the candidate's latest verdict over its correct uniform cases; None = no verdict."""
    n_cases: int = Field(0, ge=0)
    geomean_ragged: Optional[float] = Field(default=None, gt=0)
    """Geomean speedup over its correct ragged cases; None = none timed (and in older snapshots)."""
    n_ragged: int = Field(0, ge=0)
    pct_limit: Optional[float] = Field(default=None, ge=0)
    """Geomean PCT_LIMIT over the correct uniform cases that have one (None in older snapshots)."""
    pct_limit_ragged: Optional[float] = Field(default=None, ge=0)
    verdict_rows: int = Field(0, ge=0)
    failed: bool = True
    """No verdict, or a verdict row that is incorrect or not ok."""
    device: Optional[str] = None
    """Device of that verdict (geomeans are compared only between iterations on one device)."""
    parent_commit: Optional[str] = None
    """HEAD before this iteration's commit."""
    branch: str = ""
    rows: list[str] = Field(default_factory=list)
    """row_id of every row of that verdict, in ledger order (the rows are in the ledger)."""
    base: Optional[str] = None
    """The snapshot folder whose files files.json changes into this one's; None: the files are here whole."""
    files: dict[str, str] = Field(default_factory=dict)
    """Relative path -> sha256 of every file of the snapshot (empty in schema 1 snapshots)."""


def slugify(text: str, limit: int = 40) -> str:
    """A folder-safe label: lowercase ascii words joined by '-'."""
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug[:limit].rstrip("-") or "iter"


def tables(root: Path) -> list[str]:
    """The tuning tables the candidate reads under root (results/<backend>/tuning.csv), relative, sorted."""
    root = Path(root)
    return sorted(p.relative_to(root).as_posix() for p in (root / "results").glob("*/tuning.csv") if p.is_file())


def is_table(rel: str) -> bool:
    """Whether a snapshot's relative path is one of `tables`."""
    parts = rel.split("/")
    return len(parts) == 3 and parts[0] == "results" and parts[2] == "tuning.csv"


def _names(root: Path) -> list[str]:
    """solution/** (caches and editor swap files left out) and the tuning tables under root."""
    root = Path(root)
    sol = [p.relative_to(root).as_posix() for p in (root / "solution").rglob("*") if p.is_file()]
    return sorted(n for n in sol if not _SKIP.search(n)) + tables(root)


def workspace_files(ws: Path) -> delta.Files:
    """The files a snapshot of the workspace keeps: solution/ and the tuning tables the candidate reads (two
    folders above its own: a candidate restored beside the tree finds the table it was verified with)."""
    return delta.read_tree(ws, _names(ws))


def snapshots(ws: Path) -> list[tuple[Path, SnapshotMeta]]:
    """Every readable trajectory snapshot, by iteration then name (unreadable ones are skipped)."""
    out = []
    root = Path(ws) / "trajectory"
    for d in root.iterdir() if root.is_dir() else ():
        if d.name.startswith(".") or not (d / "meta.json").is_file():
            continue
        try:
            out.append((d, SnapshotMeta.model_validate_json((d / "meta.json").read_text())))
        except ValueError:
            continue
    return sorted(out, key=lambda t: (t[1].iteration, t[0].name))


def restorable(path: Path) -> bool:
    """Whether a snapshot folder holds files to restore (whole or as a delta)."""
    return (Path(path) / "solution").is_dir() or (Path(path) / DELTA).is_file()


def files(path: Path) -> delta.Files:
    """A snapshot's files, byte for byte: read whole, or its base's files with its delta applied (down the
    chain), checked against meta.files; WorkspaceError when the chain is broken or a file differs."""
    path = Path(path)
    chain = []
    while not (path / "solution").is_dir():
        meta = SnapshotMeta.model_validate_json((path / "meta.json").read_text())
        if not (path / DELTA).is_file() or not meta.base or path.name in {p.name for p, _ in chain}:
            raise WorkspaceError(f"snapshot {path.name} holds no files and no delta against another snapshot")
        chain.append((path, meta))
        path = path.parent / meta.base
        if not (path / "meta.json").is_file():
            raise WorkspaceError(f"snapshot {chain[-1][0].name} is a delta against {meta.base}, which is missing")
    out = delta.read_tree(path, _names(path))
    _check(path, out)
    for p, meta in reversed(chain):
        try:
            out = delta.apply(out, json.loads((p / DELTA).read_text()))
        except (ValueError, KeyError, TypeError) as e:
            raise WorkspaceError(f"snapshot {p.name}: its delta does not apply: {e}") from None
        _check(p, out, meta)
    return out


def _check(path: Path, got: delta.Files, meta: Optional[SnapshotMeta] = None) -> None:
    meta = meta or SnapshotMeta.model_validate_json((path / "meta.json").read_text())
    if meta.files and delta.manifest(got) != meta.files:
        bad = sorted(set(meta.files) ^ set(got) | {k for k in meta.files if meta.files.get(k) !=
                                                   delta.manifest(got).get(k)})
        raise WorkspaceError(f"snapshot {path.name}: restored files differ from its record: {', '.join(bad[:5])}")


def _chain_bytes(path: Optional[Path]) -> int:
    """Bytes of the deltas from snapshot `path` back to the last whole one."""
    total = 0
    while path is not None and (path / DELTA).is_file():
        total += (path / DELTA).stat().st_size
        base = SnapshotMeta.model_validate_json((path / "meta.json").read_text()).base
        path = path.parent / base if base else None
    return total


def _store(dst: Path, new: delta.Files, prev: Optional[tuple[Path, delta.Files]],
           chain: int) -> tuple[Optional[str], int]:
    """Write a snapshot's files into dst: a delta against prev (folder, files) while the chain of deltas back to
    a whole snapshot (`chain` bytes before this one) stays smaller than the files, else whole. Returns (the
    base's folder name, the chain's bytes with this delta), (None, 0) when stored whole."""
    if prev is not None:
        text = json.dumps(delta.diff(prev[1], new), ensure_ascii=False, indent=0) + "\n"
        chain += len(text.encode())
        if chain <= sum(len(d) for d, _ in new.values()):
            (dst / DELTA).write_text(text)
            return prev[0].name, chain
    delta.write_tree(dst, new)
    return None, 0


def _previous(ws: Path) -> Optional[tuple[Path, delta.Files]]:
    """The last restorable snapshot and its files, the base of the next delta; None when there is none or its
    files cannot be rebuilt (a hand-edited or broken chain: the next snapshot is then stored whole)."""
    last = next((p for p, _ in reversed(snapshots(ws)) if restorable(p)), None)
    try:
        return (last, files(last)) if last is not None else None
    except WorkspaceError:
        return None


def write(ws: Path, n: int, description: str, branch: str = "", parent_commit: Optional[str] = None,
          verdict: Optional[dict] = None) -> Path:
    """Snapshot iteration N (its files, the candidate's latest verdict by row id, entry N of ITERATIONS.md) into
    trajectory/<N>-<stamp>-<label>/, atomically; returns the folder. verdict: the SnapshotMeta fields of the
    candidate's latest verdict (kopt.policy.iterations.snapshot_verdict); None: it has none."""
    from kopt.candidate import content_hash, short_id
    from kopt.store import journal

    ws = Path(ws)
    now = datetime.now(timezone.utc)
    label = slugify(description)
    try:
        h = content_hash(ws / CANDIDATE_REL)
    except OSError:
        h = None
    cid = short_id(h) if h else None
    new = workspace_files(ws)
    prev = _previous(ws)
    traj = ws / "trajectory"
    traj.mkdir(exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{n}-", dir=traj))
    tmp.chmod(0o755)  # mkdtemp makes 0700; the snapshot is ordinary workspace content
    try:
        base, _ = _store(tmp, new, prev, _chain_bytes(prev[0]) if prev else 0)
        meta = SnapshotMeta(iteration=n, label=label, description=description,
                            created=now.isoformat(timespec="seconds"), candidate_hash=h, candidate_id=cid,
                            branch=branch, parent_commit=parent_commit, base=base,
                            files=delta.manifest(new), **(verdict or {}))
        if (entry := journal.entry_text(ws, n)) is not None:
            (tmp / "iteration.md").write_text(entry)
        (tmp / "meta.json").write_text(meta.model_dump_json(indent=1) + "\n")
        final = traj / f"{n}-{now:%Y%m%dT%H%M%S}-{label}"
        k = 1
        while final.exists():  # two commits in one second: keep both
            final, k = traj / f"{n}-{now:%Y%m%dT%H%M%S}-{label}-{k}", k + 1
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def extract(path: Path, dest: Path) -> list[str]:
    """Write a snapshot's files (solution/, its tuning tables) under dest, as a folder to run the iteration's
    candidate from beside the tree; returns their relative paths. Files already in dest are overwritten."""
    got = files(path)
    delta.write_tree(dest, got)
    return sorted(got)


@dataclass
class Migrated:
    """One schema 1 snapshot stored lean by `migrate`."""

    name: str
    before: int
    """Bytes of the folder before, and after."""
    after: int
    base: Optional[str]


def _bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def migrate(ws: Path, dry_run: bool = False) -> list[Migrated]:
    """Store every schema 1 snapshot lean, oldest first: its files as a delta against the snapshot before it
    (whole where the chain would outgrow them), its results.json rows by id; each new folder is checked to
    restore the same bytes before it replaces the old one. Other files of the folder are kept."""
    out, prev, chain = [], None, 0
    for path, meta in snapshots(ws):
        if not restorable(path):
            continue
        have = files(path)
        if meta.schema_version >= 2:
            prev, chain = (path, have), _chain_bytes(path)
            continue
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{meta.iteration}-", dir=path.parent))
        tmp.chmod(0o755)
        try:
            base, chain = _store(tmp, have, prev, chain)
            rows = meta.rows
            if (path / "results.json").is_file():
                rows = [str(r.get("row_id")) for r in json.loads((path / "results.json").read_text())]
            for p in path.iterdir():
                if p.name not in ("solution", "results", "results.json", "meta.json"):
                    shutil.copytree(p, tmp / p.name) if p.is_dir() else shutil.copy2(p, tmp / p.name)
            lean = meta.model_copy(update={"schema_version": 2, "base": base, "files": delta.manifest(have),
                                           "rows": rows})
            (tmp / "meta.json").write_text(lean.model_dump_json(indent=1) + "\n")
            if files(tmp) != have:
                raise WorkspaceError(f"snapshot {path.name} would not restore the same files: left as it was")
            out.append(Migrated(path.name, _bytes(path), _bytes(tmp), base))
            if dry_run:
                shutil.rmtree(tmp)
            else:
                old = path.parent / f".tmp-old-{path.name}"
                os.rename(path, old)
                os.rename(tmp, path)
                shutil.rmtree(old)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        prev = (path, have)
    return out
