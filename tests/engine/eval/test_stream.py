"""Lines as they happen: each case's machine line is on stdout when its case finishes, not at the end of the
run; `--budget` stops a run cleanly and says what was not run. Real `kopt` processes on the CPU."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from kopt.records import CaseResult, parse_line
from kopt.store.ledger import load

ADV = Path(__file__).resolve().parents[2] / "adversarial"
SRC = Path(__file__).resolve().parents[3] / "src"

#: A torch candidate that holds its first call on case 2 (batch 4) until a file beside it exists: the test
#: decides when case 2 may end, so nothing here depends on how fast the machine is.
HOLDING = '''"""Honest torch attention that waits on case 2 until released."""
import time
from pathlib import Path

from _ref import attention

BACKEND = "torch"
RELEASE = Path(__file__).with_name("release")


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):
    while q.shape[0] == 4 and not RELEASE.exists():
        time.sleep(0.05)
    return attention(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale)
'''


def _candidate(tmp_path: Path) -> Path:
    (tmp_path / "_ref.py").write_text((ADV / "_ref.py").read_text())
    p = tmp_path / "holding.py"
    p.write_text(HOLDING)
    return p


def _kopt(*args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen([sys.executable, "-m", "kopt", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def test_first_line_arrives_before_the_last_case_ends(tmp_path, workspace):
    cand = _candidate(tmp_path)
    p = _kopt("bench", "--case", "1,2", "--device", "cpu", "--machine", "--quick", "--candidate", str(cand))
    try:
        first = p.stdout.readline()          # case 2 cannot end before the release below
        assert parse_line(first)["CASE"] == "1" and parse_line(first)["CORRECT"] == "True", first
        assert p.poll() is None, "the run ended before case 2 was released"
        rows = load(CaseResult, workspace / "candidates.jsonl").rows
        assert [r.case for r in rows] == [1], "case 1's row is in the ledger while case 2 runs"
        (tmp_path / "release").touch()
        rest, err = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err
    assert [parse_line(x)["CASE"] for x in rest.splitlines()] == ["2"]
    assert "kopt bench: case 1" in err and "(1/2," in err   # a progress line per case on stderr


def test_budget_stops_the_run_and_names_what_was_not_run(tmp_path, workspace):
    # never released: case 2 would wait for the timeout (600 s). 20 s lets case 1 (a second or two of torch on a
    # tiny case) run first on a quiet machine; on a loaded one it may not, and the checks below hold either way
    cand = _candidate(tmp_path)
    t0 = time.perf_counter()
    p = _kopt("bench", "--case", "1,2", "--device", "cpu", "--machine", "--quick", "--budget", "20",
              "--candidate", str(cand))
    out, err = p.communicate(timeout=300)
    assert time.perf_counter() - t0 < 240, "the budget, not the per-case timeout, ended the run"
    assert p.returncode == 0, err               # nothing that ran failed
    lines = out.strip().splitlines()
    stopped = parse_fields(lines[-1])
    assert stopped["STOPPED"] == "budget" and stopped["BUDGET_S"] == "20"
    assert "2" in stopped["NOT_RUN"].split(",")
    ran = [parse_line(x)["CASE"] for x in lines[:-1]]
    assert sorted(ran + stopped["NOT_RUN"].split(",")) == ["1", "2"] and stopped["RAN"] == str(len(ran))
    assert "not run: " in err and "budget" in err
    rows = load(CaseResult, workspace / "candidates.jsonl").rows
    assert [str(r.case) for r in rows] == ran  # a case stopped by the budget leaves no row


def parse_fields(line: str) -> dict[str, str]:
    """KEY:VALUE fields of any kopt line."""
    return dict(f.split(":", 1) for f in line.split())
