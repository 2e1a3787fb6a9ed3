"""The workspace template: the files `kopt init` writes into a new workspace, each kept once.

Most of them are the project's own top-level files, named by SHIPPED (the starter kernel, SKILL.md, HINTS.md,
bench/, knowledge/, the prompts); kopt/templates/ holds only what a new workspace gets that the project has no
copy of (its README). Where the shipped files are is `root()`: the repository root beside src/ when kopt runs
from its source tree (an editable install, PYTHONPATH=src), else kopt/templates/ of the installed package, where
the build copied them (setup.py: the wheel's build_py, the sdist's file list).

Standard library only, and no kopt import: the build loads this file by its path.
"""

from __future__ import annotations

from pathlib import Path

#: The project's top-level paths that form the workspace template: globs relative to the repository root, each
#: matching at least one file. The starter candidate comes with every sibling module it imports
#: (kopt.candidate.sources; tests/engine/workspace/test_init.py checks the list holds them all).
SHIPPED = (
    "SKILL.md",
    "HINTS.md",
    "bench/cases.yaml",
    "bench/workloads.yaml",
    "knowledge/**/*.md",
    "workflows/prompts/*.md",
    "solution/cuda/README.md",
    "solution/tilelang/run_kernel.py",
    "solution/tilelang/tl_decode_cpu.py",
    "solution/tilelang/tl_decode_cuda.py",
    "solution/tilelang/tl_device.py",
    "solution/tilelang/tuning_lookup.py",
)
PACKAGE_DIR = Path(__file__).resolve().parent
#: The package's template folder: template-only files, and in a built package the shipped ones too.
TEMPLATES = PACKAGE_DIR / "templates"


def source_root() -> Path | None:
    """The repository root when kopt runs from its source tree (kopt in src/, pyproject.toml beside src/), else
    None (an installed package)."""
    top = PACKAGE_DIR.parents[1]
    return top if PACKAGE_DIR.parent.name == "src" and (top / "pyproject.toml").is_file() else None


def root() -> Path:
    """Where the shipped files are: the repository root in a source tree, kopt/templates/ in a built package."""
    return source_root() or TEMPLATES


def shipped(top: Path) -> dict[str, Path]:
    """Relative path -> file for every SHIPPED file under `top`, sorted; FileNotFoundError naming the first
    pattern that matches no file (a template without it would be incomplete)."""
    top = Path(top)
    out: dict[str, Path] = {}
    for pattern in SHIPPED:
        found = [p for p in top.glob(pattern) if p.is_file() and "__pycache__" not in p.parts]
        if not found:
            raise FileNotFoundError(f"the workspace template names {pattern}, but {top} has no such file")
        out.update({p.relative_to(top).as_posix(): p for p in found})
    return dict(sorted(out.items()))


def files() -> dict[str, Path]:
    """Relative path -> file for everything `kopt init` copies: kopt/templates/ (caches left out) and the shipped
    files where root() has them (FileNotFoundError when one is missing)."""
    out = {p.relative_to(TEMPLATES).as_posix(): p for p in TEMPLATES.rglob("*")
           if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}
    out.update(shipped(root()))
    return dict(sorted(out.items()))


def file(rel: str) -> Path:
    """The template's copy of one shipped file (bench/cases.yaml, bench/workloads.yaml): what a workspace without
    its own reads."""
    return root() / rel
