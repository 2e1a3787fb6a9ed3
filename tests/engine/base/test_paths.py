"""kopt.paths.recorded: how a row names a candidate's file, never by the host's home or temporary path."""

from __future__ import annotations

import tempfile
from pathlib import Path


def test_a_row_names_files_without_the_hosts_paths(tmp_path, monkeypatch):
    """Inside the workspace: relative to it; a copy in kopt's cache (a patched or revision candidate): <kopt cache>/...;
    in the temporary folder (a verdict's reigning candidate): <tmp>/...; any other path as given."""
    from kopt.paths import cache_home, recorded

    ws = tmp_path / "ws"
    (ws / "solution").mkdir(parents=True)
    monkeypatch.setenv("KOPT_WORKSPACE", str(ws))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home" / ".cache"))
    assert recorded(ws / "solution" / "run_kernel.py") == "solution/run_kernel.py"
    patched = cache_home() / "patched" / "0123456789abcdef" / "solution" / "tilelang" / "run_kernel.py"
    assert recorded(patched) == "<kopt cache>/patched/0123456789abcdef/solution/tilelang/run_kernel.py"
    reigning = Path(tempfile.gettempdir()) / "kopt-reigning-x" / "0d6f5eccc5e5" / "run_kernel.py"
    assert recorded(reigning) == "<tmp>/kopt-reigning-x/0d6f5eccc5e5/run_kernel.py"
    assert recorded("/opt/elsewhere/run_kernel.py") == "/opt/elsewhere/run_kernel.py"
    assert recorded(ws / "solution" / "run_kernel.py", root=ws / "solution") == "run_kernel.py"
