"""No file under src, solution, scripts or tests is a byte copy of another: a copy drifts, the one nobody edited
goes on being read. trajectory/ (the loop's snapshots of solution/, copies by design) lies outside these folders.

Files are compared by content hash, on disk as a checkout has them; what git ignores there (caches, build and
egg-info folders, dot folders) is left out. Empty files are exempt: every empty file equals every other, and one
holds nothing that could drift (an empty `__init__.py` or `.gitkeep`).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FOLDERS = ("src", "solution", "scripts", "tests")
#: Folders a build, a test run or a tool leaves in a checkout (git ignores them); dot folders too.
LEFT_OUT = {"__pycache__", "build", "dist"}


def _counted(rel: Path) -> bool:
    return not any(part in LEFT_OUT or part.startswith(".") or part.endswith(".egg-info") for part in rel.parts) \
        and rel.suffix != ".pyc"


def copies(top: Path, folders: tuple[str, ...] = FOLDERS) -> list[list[str]]:
    """Groups of files (paths relative to top, sorted) under `folders` of `top` with the same non-empty content."""
    by_hash: dict[str, list[str]] = defaultdict(list)
    for folder in folders:
        for p in sorted((top / folder).rglob("*")):
            rel = p.relative_to(top)
            if p.is_file() and _counted(rel) and p.stat().st_size:
                by_hash[hashlib.sha256(p.read_bytes()).hexdigest()].append(rel.as_posix())
    return sorted(sorted(group) for group in by_hash.values() if len(group) > 1)


def test_no_file_is_a_copy_of_another():
    found = copies(REPO)
    assert not found, "byte copies (keep one, read it from where it is): " + "; ".join(" = ".join(g) for g in found)


def test_a_planted_copy_is_found(tmp_path):
    """The check finds a copy across folders and within one, and leaves out empty files, caches and trajectory/."""
    files = {"src/kopt/a.py": "x = 1\n", "tests/b.py": "x = 1\n", "scripts/c.sh": "echo\n", "solution/d/c.sh": "echo\n",
             "src/kopt/__init__.py": "", "tests/__init__.py": "", "src/kopt/__pycache__/a.py": "x = 1\n",
             "trajectory/0001/a.py": "x = 1\n", "solution/e.py": "y = 2\n"}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert copies(tmp_path) == [["scripts/c.sh", "solution/d/c.sh"], ["src/kopt/a.py", "tests/b.py"]]
