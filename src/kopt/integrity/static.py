"""AST checks on candidate source: the candidate file and every sibling module it imports.

Names are resolved through the file's imports and simple assignments (flow-insensitive, so a
name bound to two things is checked as both): `F.softmax` with `import torch.nn.functional as F`
is `torch.nn.functional.softmax`. What cannot be resolved statically (strings built at run time)
is left to the dynamic guards in the evaluation child; such constructs get a warning here.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from kopt.integrity import rules as R
from kopt.integrity.checker import Checker
from kopt.integrity.rules import Finding


def static_check(path) -> list[Finding]:
    """Findings for a candidate file and the sibling modules it imports (errors block evaluation)."""
    path = Path(path)
    tree, bad = _parse(path, "KS001")
    if tree is None:
        return [bad]
    backend, out = _backend(tree, path.name)
    strict = backend is None or backend == "tilelang"
    local = _local_roots(path.parent)
    seen = {path.resolve()}
    queue = [(path, tree)]
    while queue:
        p, t = queue.pop(0)
        c = Checker(p.name, strict, local)
        c.check(t)
        out += c.findings
        for sib in _siblings(path.parent, c.imported):
            if sib.resolve() in seen:
                continue
            seen.add(sib.resolve())
            st, bad = _parse(sib, "KS004")
            if st is None:
                out.append(bad)
            else:
                queue.append((sib, st))
    uniq = {(f.file, f.code, f.line): f for f in reversed(out)}
    return sorted(uniq.values(), key=lambda f: (f.file != path.name, f.file, f.line, f.code))


def _parse(path: Path, code: str):
    try:
        return ast.parse(path.read_text(encoding="utf-8"), filename=path.name), None
    except SyntaxError as e:
        return None, Finding(code, "warning", f"cannot parse: {e.msg}", e.lineno or 0, path.name)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return None, Finding(code, "warning", f"cannot read: {type(e).__name__}", 0, path.name)


def _backend(tree: ast.Module, file: str) -> tuple[str | None, list[Finding]]:
    """The literal BACKEND of the module, and findings when it is missing or not one literal."""
    sets = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        sets += [(node, t) for t in targets if isinstance(t, ast.Name) and t.id == "BACKEND"]
    if not sets:
        return None, [Finding("KS003", "warning", R.RULES["KS003"][1], 1, file)]
    node = sets[0][0]
    value = getattr(node, "value", None)
    ok = (len(sets) == 1 and node in tree.body and isinstance(node, (ast.Assign, ast.AnnAssign))
          and isinstance(value, ast.Constant) and isinstance(value.value, str))
    if not ok:
        return None, [Finding("KS002", "error", "BACKEND must be assigned once, at module level, to a string literal",
                              node.lineno, file)]
    return value.value, []


def _local_roots(folder: Path) -> set[str]:
    """Importable names the candidate's folder provides (and no installed module already does)."""
    names = {p.stem for p in folder.glob("*.py")} | {p.parent.name for p in folder.glob("*/__init__.py")}
    out = set()
    for n in names:
        try:
            installed = importlib.util.find_spec(n) is not None
        except (ImportError, ValueError):
            installed = False
        if not installed:
            out.add(n)
    return out


def _siblings(folder: Path, modules: list[str]) -> list[Path]:
    """Files in the candidate's folder that the imported module names refer to."""
    found = []
    if "*" in modules:
        return sorted(folder.glob("*.py"))
    for mod in modules:
        parts = mod.split(".")
        for i in range(len(parts), 0, -1):
            base = folder.joinpath(*parts[:i])
            for f in (base.with_suffix(".py"), base / "__init__.py"):
                if f.is_file() and f not in found:
                    found.append(f)
    return found
