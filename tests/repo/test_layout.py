"""kopt's import graph, read with `ast`: no cycle between modules, no cycle between stages (the packages and
modules directly under kopt), no import against the layers ARCHITECTURE.md declares, no use of another module's
private name.

Every import counts, the lazy ones inside functions included; relative imports are resolved against the
importing module's package. Imports under `if TYPE_CHECKING:` never run, so they are left out of the cycle and
layer checks (they still may not name another module's private name).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
ROOT = "kopt"
ARCHITECTURE = SRC.parent / "ARCHITECTURE.md"


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


def stage(module: str) -> str:
    """The stage a module belongs to: kopt.X for kopt.X and everything under it; kopt for the package's __init__."""
    return ".".join(module.split(".")[:2])


def _crossing(edges: list[Edge]) -> list[Edge]:
    """The imports that run (not under TYPE_CHECKING) from one stage into another."""
    return [e for e in edges if not e.typing_only and stage(e.src) != stage(e.dst)]


def _loop(crossing: list[Edge], comp: list[str]) -> list[str]:
    """The shortest loop of stages through comp[0] inside the cycle `comp`, its first stage repeated at the end."""
    graph: dict[str, set[str]] = {}
    for e in crossing:
        graph.setdefault(stage(e.src), set()).add(stage(e.dst))
    start, members = comp[0], set(comp)
    prev: dict[str, str] = {}
    queue = [start]
    for v in queue:
        for w in sorted(graph.get(v, ()) & members):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(prev[path[-1]])
                return [*reversed(path), start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return comp


def stage_cycles(edges: list[Edge]) -> list[str]:
    """Each cycle between stages as a line naming its shortest loop, then every import that closes it (file:line,
    module -> module); empty when the stages form no cycle."""
    crossing = _crossing(edges)
    lines = []
    for comp in cycles([Edge(stage(e.src), stage(e.dst), e.where, False) for e in crossing]):
        members = set(comp)
        lines.append("stage cycle: " + " -> ".join(_loop(crossing, comp)))
        lines += [f"  {stage(e.src)} -> {stage(e.dst)}: {e.where} ({e.src} -> {e.dst})" for e in crossing
                  if stage(e.src) in members and stage(e.dst) in members]
    return lines


def declared_layers(text: str) -> list[list[str]]:
    """The stages of each line of the Layers table of ARCHITECTURE.md's text, the top line first."""
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| ") and not ln.startswith("| layer |")]
    return [[ROOT if n == ROOT else f"{ROOT}.{n}" for n in re.findall(r"`([\w.]+)`", row.split("|")[2])]
            for row in rows]


def layer_violations(edges: list[Edge], layers: list[list[str]], stages: set[str]) -> list[str]:
    """Every import of a stage on a line above the importer's (file:line), every stage on no line or on two, every
    line's stage that does not exist."""
    level: dict[str, int] = {}
    out = []
    for i, line in enumerate(layers):
        for s in line:
            if s in level:
                out.append(f"{s} is on two lines of the layers")
            level.setdefault(s, i)
    out += [f"stage {s} is on no line of ARCHITECTURE.md's layers" for s in sorted(stages - level.keys())]
    out += [f"the layers name {s}, which is no stage" for s in sorted(level.keys() - stages)]
    for e in _crossing(edges):
        a, b = stage(e.src), stage(e.dst)
        if a in level and b in level and level[b] < level[a]:
            out.append(f"{a} imports {b}, a layer above it: {e.where} ({e.src} -> {e.dst})")
    return out


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


def test_the_stage_check_sees_a_cycle_closed_by_lazy_imports(tmp_path):
    """No module imports one that imports it back, so the module check passes; the two packages still import each
    other, through imports inside functions, one of them relative: the stage check names that cycle and the
    imports that close it."""
    files = {
        "kopt/__init__.py": "",
        "kopt/alpha/__init__.py": "",
        "kopt/alpha/one.py": "def f():\n    from kopt.beta import two\n    return two.Y\n",
        "kopt/alpha/four.py": "X = 1\n",
        "kopt/beta/__init__.py": "",
        "kopt/beta/two.py": "Y = 2\n",
    }
    one_way, _ = scan(_tree(tmp_path / "one-way", files))
    assert stage_cycles(one_way) == []
    files["kopt/beta/three.py"] = "def g():\n    from ..alpha import four\n    return four.X\n"
    edges, _ = scan(_tree(tmp_path / "both-ways", files))
    assert cycles(edges) == []
    assert stage_cycles(edges) == [
        "stage cycle: kopt.alpha -> kopt.beta -> kopt.alpha",
        "  kopt.alpha -> kopt.beta: kopt/alpha/one.py:2 (kopt.alpha.one -> kopt.beta.two)",
        "  kopt.beta -> kopt.alpha: kopt/beta/three.py:2 (kopt.beta.three -> kopt.alpha.four)",
    ]


def test_the_layer_check_flags_an_import_from_below_and_an_unplaced_stage():
    layers = [["kopt.top"], ["kopt.low", "kopt.side"]]
    edges = [Edge("kopt.top.a", "kopt.low.b", "kopt/top/a.py:3", False),
             Edge("kopt.low.b", "kopt.side", "kopt/low/b.py:4", False),
             Edge("kopt.low.c", "kopt.top.a", "kopt/low/c.py:9", False),
             Edge("kopt.side", "kopt.top", "kopt/side.py:7", True)]  # under TYPE_CHECKING: never runs
    assert layer_violations(edges, layers, {"kopt.top", "kopt.low", "kopt.side", "kopt.new"}) == [
        "stage kopt.new is on no line of ARCHITECTURE.md's layers",
        "kopt.low imports kopt.top, a layer above it: kopt/low/c.py:9 (kopt.low.c -> kopt.top.a)",
    ]
    assert layer_violations(edges[:2], layers, {"kopt.top", "kopt.low", "kopt.side"}) == []


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


def test_no_import_cycle_between_stages():
    found = stage_cycles(scan()[0])
    assert not found, "\n" + "\n".join(found)


def test_every_import_keeps_to_the_declared_layers():
    layers = declared_layers(ARCHITECTURE.read_text())
    assert len(layers) > 3 and ["kopt.store"] in layers and ["kopt.policy"] in layers
    stages = {stage(m) for m in module_names()}
    found = layer_violations(scan()[0], layers, stages)
    assert not found, "\n" + "\n".join(found)


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


def test_the_store_and_policy_faces_give_their_modules_own_objects():
    import importlib

    import pytest

    for pkg in ("kopt.store", "kopt.policy"):
        face = importlib.import_module(pkg)
        assert face.__all__
        for name in face.__all__:
            obj = getattr(face, name)
            assert obj.__module__.startswith(f"{pkg}.")
            assert getattr(importlib.import_module(obj.__module__), name) is obj
        with pytest.raises(AttributeError):
            face.no_such_name  # noqa: B018
