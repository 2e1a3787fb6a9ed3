"""kopt.bytecode: library bytecode cached in kopt's folder where the environment writes none; a candidate's code
always compiled from its current sources (a stale .pyc of the same size and second is never run). Real
subprocesses with their own environments."""

from __future__ import annotations

import os
import py_compile
import subprocess
import sys
from pathlib import Path

from kopt import bytecode, proc

SRC = str(Path(__file__).resolve().parents[3] / "src")


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX",
                                                            bytecode.ENV_CACHE)}
    env["PYTHONPATH"] = SRC
    env.update(extra)
    return env


def test_the_cache_folder_only_where_the_environment_writes_no_bytecode(tmp_path):
    assert bytecode.cache_dir({}) is None  # Python writes its own .pyc: nothing to change
    off = {"PYTHONDONTWRITEBYTECODE": "1", "HOME": str(tmp_path)}
    assert bytecode.cache_dir(off) == str(tmp_path / ".cache" / "kopt" / "pycache")
    assert bytecode.cache_dir({**off, "XDG_CACHE_HOME": "/c"}) == "/c/kopt/pycache"
    assert bytecode.cache_dir({**off, bytecode.ENV_CACHE: "/mine"}) == "/mine"
    assert bytecode.cache_dir({**off, bytecode.ENV_CACHE: "0"}) is None
    assert bytecode.cache_dir({**off, "PYTHONPYCACHEPREFIX": "/users"}) is None  # the user's own prefix stays
    env = bytecode.child_env({**off, "A": "b"})
    assert "PYTHONDONTWRITEBYTECODE" not in env and env["PYTHONPYCACHEPREFIX"] == bytecode.cache_dir(off)
    assert env["A"] == "b" and off["PYTHONDONTWRITEBYTECODE"] == "1"  # a copy
    assert bytecode.child_env({"A": "b"}) == {"A": "b"}


def test_children_of_a_no_bytecode_environment_write_it_to_kopts_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    monkeypatch.setenv(bytecode.ENV_CACHE, str(tmp_path / "pyc"))
    env = proc.child_env()
    assert env["PYTHONPYCACHEPREFIX"] == str(tmp_path / "pyc") and "PYTHONDONTWRITEBYTECODE" not in env
    mod = tmp_path / "lib" / "some_library.py"
    mod.parent.mkdir()
    mod.write_text("X = 1\n")
    subprocess.run([sys.executable, "-c", "import some_library"], env={**env, "PYTHONPATH": str(mod.parent)},
                   check=True)
    assert list((tmp_path / "pyc").rglob("some_library.*.pyc"))  # cached in kopt's folder
    assert not (mod.parent / "__pycache__").exists()  # nothing beside the source
    # the kopt command does the same for itself
    out = subprocess.run([sys.executable, "-c", "import sys, kopt.cli.main; print(sys.pycache_prefix, "
                          "sys.dont_write_bytecode)"], env={**os.environ, "PYTHONPATH": SRC}, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == [str(tmp_path / "pyc"), "False"]


def cache_name(module: str) -> str:
    return f"{module}.{sys.implementation.cache_tag}.pyc"


def _candidate_with_stale_bytecode(tmp_path: Path) -> Path:
    """A candidate whose sibling module has a .pyc of an older version: same size, same whole-second time."""
    folder = tmp_path / "cand"
    folder.mkdir()
    lib = folder / "tiles.py"
    lib.write_text("BLOCK_N = 64\n")
    stamp = lib.stat().st_mtime
    cache = folder / "__pycache__" / cache_name("tiles")
    py_compile.compile(str(lib), cfile=str(cache), doraise=True)
    lib.write_text("BLOCK_N = 32\n")  # the edit: same size
    os.utime(lib, (stamp, stamp))  # and within the same second
    cand = folder / "run_kernel.py"
    cand.write_text("import tiles\n\n\ndef run(q, k_cache, v_cache, cache_seqlens, **kw):\n    return tiles.BLOCK_N\n")
    return cand


def test_a_candidate_never_runs_stale_bytecode(tmp_path):
    cand = _candidate_with_stale_bytecode(tmp_path)
    plain = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(cand.parent)!r}); "
                            "import tiles; print(tiles.BLOCK_N)"], env=_env(), capture_output=True, text=True,
                           check=True).stdout.strip()
    assert plain == "64"  # what Python itself runs: the old code (the test's premise)
    (cand.parent / "helper.pyc").write_bytes((cand.parent / "__pycache__" / cache_name("tiles")).read_bytes())
    for extra in ({}, {"PYTHONDONTWRITEBYTECODE": "1", bytecode.ENV_CACHE: str(tmp_path / "pyc")}):
        code = ("from kopt import candidate; import importlib.util as u\n"
                f"m = candidate.load({str(cand)!r}); print(m.run(0, 0, 0, 0))\n"
                "print(u.find_spec('helper') is None)\n")  # a lone .pyc there is no module
        env = bytecode.child_env(_env(**extra))  # as kopt starts a child
        got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                             check=True).stdout.split()
        assert got == ["32", "True"], extra
    # nothing written for the candidate's modules; library code keeps its cache
    assert not list((tmp_path / "pyc").rglob("tiles*.pyc")) and list((tmp_path / "pyc").rglob("candidate*.pyc"))
