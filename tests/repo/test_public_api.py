"""Nothing outside src/kopt reaches into kopt or into the kernel: read with `ast`, every Python file of scripts/,
solution/, workflows/ and bench/ imports no `kopt.cli.*` module, no `_private` name or module of kopt, and no private
module of a kernel (the modules beside a solution's run_kernel.py: tl_decode_cuda, tl_device, ...) from outside that
kernel's folder. They use kopt's public faces (a package's __init__ exports, a module's public names) and the
kernel's contract (run, configs, prepare, plan_info, device_plan, or what run_kernel.py exposes).

The rule for tests/: tests mirror the package, so they may import the module they test, `_private` helpers
included, and kopt.cli (commands are tested through it); a kernel's private modules are imported only by the
kernel's own tests (KERNEL_TESTS). scripts/ holds no kopt tool: at most a few thin wrappers, each a `kopt` command
(today none: the folder is gone). The FlashInfer build ships in the package (kopt/baselines/flashinfer_build) and
imports nothing of kopt."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Folders outside src/kopt whose Python files follow the rule.
SCANNED = ("scripts", "solution", "workflows", "bench")
#: The tests of the kernel itself: they may import its private modules (tl_decode_cuda, tl_device, ...).
KERNEL_TESTS = {"test_kernel_cpu.py", "test_kernel_gpu.py", "test_plan.py", "test_tuning.py", "test_wave64.py"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def kernel_modules(root: Path = ROOT) -> dict[str, Path]:
    """Each kernel's private module names -> its folder: the .py files beside a solution's run_kernel.py."""
    out: dict[str, Path] = {}
    for entry in sorted((root / "solution").glob("*/run_kernel.py")):
        for f in entry.parent.glob("*.py"):
            if f.name != "run_kernel.py":
                out[f.stem] = entry.parent
    return out


def violations(path: Path, kernel: dict[str, Path], allow_kernel: bool = False, allow_kopt: bool = False) -> list[str]:
    """What `path` imports that the rule forbids, as 'path:line: what' (allow_kernel: a kernel's own test;
    allow_kopt: kopt.cli and kopt's private names allowed, as for tests)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    rel = path.relative_to(ROOT)
    bad: list[str] = []
    kopt_aliases: set[str] = set()

    def kopt_name(dotted: str, where: int) -> None:
        parts = dotted.split(".")
        if parts[0] != "kopt" or allow_kopt:
            return
        if len(parts) > 1 and parts[1] == "cli":
            bad.append(f"{rel}:{where}: {dotted} (kopt.cli is the command layer)")
        elif any(_private(p) for p in parts):
            bad.append(f"{rel}:{where}: {dotted} (a private name of kopt)")

    def kernel_name(name: str, where: int) -> None:
        top = name.split(".")[0]
        if top in kernel and kernel[top] != path.parent and not allow_kernel:
            bad.append(f"{rel}:{where}: {name} (a private module of the kernel in {kernel[top].relative_to(ROOT)})")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                kopt_name(a.name, node.lineno)
                kernel_name(a.name, node.lineno)
                if a.name.split(".")[0] == "kopt":
                    kopt_aliases.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                kopt_name(f"{node.module}.{a.name}", node.lineno)
                if node.module.split(".")[0] == "kopt":
                    kopt_aliases.add(a.asname or a.name)
            kernel_name(node.module, node.lineno)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
            kopt_name(str(node.args[0].value), node.lineno)
            kernel_name(str(node.args[0].value), node.lineno)
        elif (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
              and isinstance(node.slice.value, str) and getattr(node.value, "attr", "") == "modules"):
            kernel_name(node.slice.value, node.lineno)  # sys.modules["tl_decode_cuda"]: a kernel module reached
    for node in ast.walk(tree):  # kopt.x._y or alias._y, where the alias is something imported from kopt
        if isinstance(node, ast.Attribute) and _private(node.attr) and not allow_kopt:
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in kopt_aliases:
                bad.append(f"{rel}:{node.lineno}: {base.id}...{node.attr} (a private name of kopt)")
    return bad


def _files(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def test_nothing_outside_src_reaches_into_kopt_or_the_kernel():
    kernel = kernel_modules()
    assert {"tl_decode_cuda", "tl_device"} <= set(kernel)
    files = [f for folder in SCANNED for f in _files(folder)]
    assert any(f.name == "run_kernel.py" for f in files)
    bad = [v for f in files for v in violations(f, kernel)]
    assert not bad, "\n".join(bad)


def test_tests_import_the_kernels_private_modules_only_in_the_kernels_own_tests():
    kernel = kernel_modules()
    tests = sorted((ROOT / "tests").rglob("test_*.py"))  # test modules (candidates/, adversarial/: fixtures)
    bad = [v for f in tests for v in violations(f, kernel, allow_kernel=f.name in KERNEL_TESTS, allow_kopt=True)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("source,found", [
    ("from kopt.cli.common import parse_ids\n", "kopt.cli.common.parse_ids (kopt.cli"),
    ("import kopt.cli.main\n", "kopt.cli.main (kopt.cli"),
    ("from kopt.timing.cuda import _Clock\n", "kopt.timing.cuda._Clock (a private name"),
    ("from kopt import candidate\nx = candidate._LOADED\n", "candidate..._LOADED (a private name"),
    ("import importlib\nm = importlib.import_module('kopt.cli.lab')\n", "kopt.cli.lab (kopt.cli"),
    ("import tl_decode_cuda as tdc\n", "tl_decode_cuda (a private module of the kernel in solution/tilelang)"),
    ("from tl_device import from_torch\n", "tl_device (a private module of the kernel"),
    ("import sys\ncu = sys.modules['tl_decode_cuda']\n", "tl_decode_cuda (a private module of the kernel"),
])
def test_the_scan_finds_each_kind_of_reach(tmp_path, source, found):
    """A planted file of each kind is caught (the scan reads imports, importlib calls and attribute access)."""
    f = ROOT / "workflows" / f"_planted_{tmp_path.name}.py"   # a scanned folder that holds no Python of its own
    f.write_text(source)
    try:
        got = violations(f, kernel_modules())
    finally:
        f.unlink()
    assert len(got) == 1 and found in got[0], got
    ok = "from kopt.cases import parse_ids\nfrom kopt.timing import make_flush\nimport kopt\nkopt.__version__\n"
    f.write_text(ok)
    try:
        assert violations(f, kernel_modules()) == []
    finally:
        f.unlink()


def test_scripts_hold_no_kopt_tool():
    """scripts/ is at most a few thin wrappers, each a `kopt` command; the FlashInfer build, which `kopt lab
    flashinfer-build` runs as a standalone script, imports nothing of kopt."""
    files = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "scripts").rglob("*")
                   if p.is_file() and "__pycache__" not in p.parts)
    assert len(files) <= 3, files
    for w in files:
        assert "kopt " in (ROOT / w).read_text(), w
    build = ROOT / "src" / "kopt" / "baselines" / "flashinfer_build" / "build.py"
    tree = ast.parse(build.read_text())
    mods = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    mods |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert mods and "kopt" not in mods, mods
