"""`kopt pack`: what travels to a GPU host, measured, and a lean copy of the workspace that holds only what a run
there reads.

The working tree that travels is the files git tracks, the untracked files git does not ignore, and the ignored
folders carried on purpose (an offline site folder, a peer kernel's build), under one size limit in all.
`measure` says what that is, entry by entry, as the tree stands and as a lean copy; `write_lean` writes the lean
copy: a new git repository with one commit, without the history a run never reads (LEAVE_OUT: trajectory/,
ITERATIONS.md, knowledge/, workflows/, the views and notes in results/), with the whole ledger, the tuning
tables, the device caches and the GPU campaign files (KEEP). Its COPIED_FROM file names the commit it was copied
from, which its rows then name (kopt.store.vcs.head_short).
"""

from __future__ import annotations

import fnmatch
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from kopt.errors import UsageError, WorkspaceError
from kopt.store import head_short
from kopt.store.vcs import COPIED_FROM, git_error, open_repo

#: The limit on the working tree that travels, carried folders included.
LIMIT = 64 << 20
#: What a run on the GPU host never reads (patterns on paths relative to the repository root)...
LEAVE_OUT = ("trajectory/*", "ITERATIONS.md", "knowledge/*", "workflows/*", "results/*")
#: ...but these stay: the tuning tables the candidate reads, the A/A calibration and copy-ceiling caches, and the
#: GPU campaigns (`kopt lab campaign workflows/campaign-*.yaml` runs on the host) with the candidate patches their
#: steps time (workflows/pending/*.patch).
KEEP = ("results/*/tuning.csv", "results/calibration-*.json", "results/hardware-*.json", "workflows/campaign-*.yaml",
        "workflows/pending/*.patch")


@dataclass
class Entry:
    """One top-level entry of what travels."""

    name: str
    files: int
    bytes: int
    carried: bool = False


@dataclass
class Travel:
    """What travels: entries of the tree (and carried folders), against the limit."""

    root: str
    entries: list[Entry] = field(default_factory=list)
    lean_bytes: int = 0
    """Bytes of the tree a lean copy would hold (carried folders not counted)."""
    limit: int = LIMIT
    commit: Optional[str] = None

    @property
    def tree_bytes(self) -> int:
        return sum(e.bytes for e in self.entries if not e.carried)

    @property
    def carried_bytes(self) -> int:
        return sum(e.bytes for e in self.entries if e.carried)

    @property
    def total(self) -> int:
        return self.tree_bytes + self.carried_bytes

    def to_dict(self) -> dict:
        """JSON-ready form, totals included."""
        return {**asdict(self), "tree_bytes": self.tree_bytes, "carried_bytes": self.carried_bytes,
                "total": self.total, "fits": self.total <= self.limit,
                "lean_total": self.lean_bytes + self.carried_bytes,
                "lean_fits": self.lean_bytes + self.carried_bytes <= self.limit}


def _size(p: Path) -> int:
    return os.lstat(p).st_size


def tree_files(root: Path) -> list[str]:
    """Paths (relative, posix) of what travels from the repository at root, carried folders aside: tracked files
    present on disk and untracked files git does not ignore."""
    repo = open_repo(root)
    top = Path(repo.working_tree_dir).resolve()
    if top != Path(root).resolve():
        raise UsageError(f"{root} is not the top of its git repository ({top}): pack the repository's top")
    names = repo.git.ls_files("-z", "--cached", "--others", "--exclude-standard").split("\0")
    return sorted({n for n in names if n and os.path.lexists(top / n) and not (top / n).is_dir()})


def in_lean_copy(name: str) -> bool:
    """Whether a lean copy holds this path."""
    keep = any(fnmatch.fnmatch(name, k) for k in KEEP)
    return keep or not any(fnmatch.fnmatch(name, p) for p in LEAVE_OUT)


def measure(root: Path, carry: tuple[Path, ...] = (), limit: int = LIMIT) -> Travel:
    """What travels from the repository at root with the folders `carry` (relative to root, or absolute)."""
    root = Path(root).resolve()
    names = tree_files(root)
    out = Travel(str(root), limit=limit, commit=head_short(root))
    by_top: dict[str, list[int]] = {}
    for n in names:
        size = _size(root / n)
        top = n.split("/")[0] + ("/" if "/" in n else "")
        by_top.setdefault(top, [0, 0])
        by_top[top][0] += 1
        by_top[top][1] += size
        out.lean_bytes += size if in_lean_copy(n) else 0
    out.entries = [Entry(k, n, b) for k, (n, b) in sorted(by_top.items(), key=lambda kv: -kv[1][1])]
    out.entries += carried(root, carry)
    return out


def carried(root: Path, carry: tuple[Path, ...]) -> list[Entry]:
    """One entry per carried folder or file (relative to root, or absolute)."""
    out = []
    for c in carry:
        p = Path(c) if Path(c).is_absolute() else Path(root) / c
        if not p.exists():
            raise UsageError(f"nothing to carry at {p}")
        files = [f for f in p.rglob("*") if not f.is_dir()] if p.is_dir() else [p]
        out.append(Entry(str(c), len(files), sum(_size(f) for f in files), carried=True))
    return out


def write_lean(root: Path, dest: Path, carry: tuple[Path, ...] = (), limit: int = LIMIT) -> Travel:
    """Write the lean copy of the repository at root into dest (new or empty) as a git repository with one
    commit; returns what travels from it (with `carry` measured where it lies now: carry it along yourself)."""
    import git

    root, dest = Path(root).resolve(), Path(dest).resolve()
    entries = carried(root, carry)  # a wrong path refused before anything is written
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise UsageError(f"{dest} exists and is not an empty folder")
    if dest == root or root in dest.parents:
        raise UsageError(f"{dest} is inside the repository it copies: pick a folder outside {root}")
    commit = head_short(root / "solution") or head_short(root)
    names = [n for n in tree_files(root) if in_lean_copy(n)]
    for n in names:
        (dest / n).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / n, dest / n, follow_symlinks=False)
    if commit:
        (dest / COPIED_FROM).write_text(commit + "\n")
    try:
        repo = git.Repo.init(dest)
        repo.git.add("-A")
        repo.git.commit("-q", "-m", f"kopt pack: lean copy of {commit or 'an uncommitted tree'}")
    except git.GitCommandError as e:
        raise WorkspaceError(f"lean copy written to {dest} but its commit failed ({git_error(e)}): "
                             "fix git (user.name/user.email?) and commit there") from None
    out = measure(dest, limit=limit)
    out.entries += entries
    return out
