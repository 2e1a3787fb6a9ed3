"""kopt.candidate.load: two candidates whose folders hold modules of the same names each import their own, in one
process (a real subprocess, so this test's process keeps no candidate modules)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[3] / "src")

RUN = ("import helper\n\n\ndef run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None, "
       "config=None):\n    return helper.VALUE\n")


def test_each_candidate_imports_its_own_sibling_modules(tmp_path):
    for name, value in (("a", 1), ("b", 2)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "run_kernel.py").write_text(RUN)
        (tmp_path / name / "helper.py").write_text(f"VALUE = {value}\n")
    script = (f"import sys; sys.path.insert(0, {SRC!r})\n"
              "from pathlib import Path\n"
              "from kopt import candidate\n"
              f"a = candidate.load(Path({str(tmp_path / 'a' / 'run_kernel.py')!r}))\n"
              f"b = candidate.load(Path({str(tmp_path / 'b' / 'run_kernel.py')!r}))\n"
              f"a2 = candidate.load(Path({str(tmp_path / 'a' / 'run_kernel.py')!r}))\n"
              "print(a.run(0, 0, 0, 0), b.run(0, 0, 0, 0), a2.run(0, 0, 0, 0))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "2", "1"], done.stdout
