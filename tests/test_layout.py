"""kopt's import graph, read with `ast`: no cycle between modules, no use of another module's private name.

Every import counts, the lazy ones inside functions included; relative imports are resolved against the
importing module's package. Imports under `if TYPE_CHECKING:` never run, so they are left out of the cycle
check (they still may not name another module's private name).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = "kopt"


@dataclass(frozen=True)
class Edge:
    """One import of module `dst` by module `src`, at `where` (path:line)."""

    src: str
    dst: str
    where: str
    typing_only: bool


def module_names(src: Path = SRC) -> dict[str, Path]:
    """Every module of the package: dotted name -> file (a package is named by its __init__.py)."""
    out: dict[str, Path] = {}
    for path in sorted((src / ROOT).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _typing_only_lines(tree: ast.AST) -> set[int]:
    """Line numbers of statements inside `if TYPE_CHECKING:` blocks."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else ""
            if name == "TYPE_CHECKING":
                for stmt in node.body:
                    for sub in ast.walk(stmt):
                        if hasattr(sub, "lineno"):
                            lines.add(sub.lineno)
    return lines


def _resolve_from(mod: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    """The absolute module an ImportFrom reads from."""
    if not node.level:
        return node.module or ""
    package = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _owner(dotted: str, modules: dict[str, Path]) -> str:
    """The longest kopt module that `dotted` names or lies inside."""
    parts = dotted.split(".")
    while parts:
        if ".".join(parts) in modules:
            return ".".join(parts)
        parts.pop()
    return ""


def scan(src: Path = SRC) -> tuple[list[Edge], list[str]]:
    """(every import edge between kopt modules, every private cross-module use as 'where: text')."""
    modules = module_names(src)
    edges: list[Edge] = []
    private: list[str] = []
    for mod, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        typing_lines = _typing_only_lines(tree)
        rel = path.relative_to(src)
        aliases: dict[str, str] = {}  # local name -> kopt module it is bound to

        def add(dst: str, node: ast.stmt, mod: str = mod, rel: Path = rel, typing_lines: set = typing_lines) -> None:
            edge = Edge(mod, dst, f"{rel}:{node.lineno}", node.lineno in typing_lines)
            if dst and dst != mod and edge not in edges:
                edges.append(edge)

        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] != ROOT:
                        continue
                    add(_owner(alias.name, modules), node)
                    if _is_private(alias.name.split(".")[-1]) and alias.name in modules:
                        private.append(f"{rel}:{node.lineno}: import {alias.name}")
                    if alias.asname:
                        aliases[alias.asname] = alias.name
                    else:
                        aliases[ROOT] = ROOT
            elif isinstance(node, ast.ImportFrom):
                base = _resolve_from(mod, _is_package(path), node)
                if base.split(".")[0] != ROOT:
                    continue
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    target = sub if sub in modules else _owner(base, modules)
                    add(target, node)
                    if target == sub:
                        aliases[alias.asname or alias.name] = sub
                    if _is_private(alias.name) and target != mod:
                        private.append(f"{rel}:{node.lineno}: from {base} import {alias.name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _is_private(node.attr):
                dotted = _dotted(node.value)
                if dotted is None:
                    continue
                head, _, rest = dotted.partition(".")
                if head not in aliases:
                    continue
                full = ".".join(filter(None, [aliases[head], rest]))
                if full in modules and full != mod:
                    private.append(f"{rel}:{node.lineno}: {dotted}.{node.attr}")
    return edges, private


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    return None


def cycles(edges: list[Edge]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        if not e.typing_only:
            graph.setdefault(e.src, set()).add(e.dst)
            graph.setdefault(e.dst, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_scanner_sees_relative_lazy_and_attribute_uses(tmp_path):
    src = _tree(tmp_path, {
        "kopt/__init__.py": "",
        "kopt/a.py": "from kopt import b\n\ndef f():\n    return b._hidden\n",
        "kopt/b.py": "def g():\n    from .pkg import c\n    return c\n_hidden = 1\n",
        "kopt/pkg/__init__.py": "from .c import _x\n",
        "kopt/pkg/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from kopt import a\n"
                         "import kopt.a\n_x = 1\n",
    })
    edges, private = scan(src)
    pairs = {(e.src, e.dst) for e in edges if not e.typing_only}
    assert {("kopt.a", "kopt.b"), ("kopt.b", "kopt.pkg.c"), ("kopt.pkg", "kopt.pkg.c"),
            ("kopt.pkg.c", "kopt.a")} <= pairs
    assert cycles(edges) == [["kopt.a", "kopt.b", "kopt.pkg.c"]]
    assert sorted(p.split(": ", 1)[1] for p in private) == ["b._hidden", "from kopt.pkg.c import _x"]


def test_the_scan_sees_the_package():
    edges, _ = scan()
    assert len(module_names()) > 20
    assert any(e.src == "kopt.cli.main" for e in edges)


def test_no_import_cycle_between_modules():
    edges, _ = scan()
    found = cycles(edges)
    lines = []
    for comp in found:
        members = set(comp)
        lines.append("cycle: " + " ".join(comp))
        lines += [f"  {e.src} -> {e.dst}  ({e.where})" for e in edges if e.src in members and e.dst in members
                  and not e.typing_only]
    assert not found, "\n" + "\n".join(lines)


def test_no_private_name_of_another_module():
    _, private = scan()
    assert not private, "\n" + "\n".join(private)


def test_ci_runs_the_readme_test_command_with_the_lint():
    repo = SRC.parent
    readme = (repo / "README.md").read_text()
    block = readme.split("this is what CI runs", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert "ruff check src tests" in block[-1] and block[-1].endswith("python3 -m pytest -q")
    run = (repo / ".ci" / "run").read_text().splitlines()
    assert run[-len(block):] == block
