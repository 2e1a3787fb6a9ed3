"""candidates.jsonl under concurrent writers and a writer killed mid-append (kill -9)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kopt.records import CaseResult
from kopt.store.ledger import append, load, load_dicts

SRC = str(Path(__file__).resolve().parents[3] / "src")

_WRITER = """
import sys
from pathlib import Path
from kopt.store.ledger import append
from kopt.records import CaseResult
path, wid, n = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
for i in range(n):
    append(path, [CaseResult(row_id=f"w{wid}-{i:05d}", case=wid + 1, message="m" * (i % 97))])
"""

_BIG_WRITER = """
import sys
from pathlib import Path
from kopt.store.ledger import append
from kopt.records import CaseResult
row = CaseResult(row_id="big", message="x" * int(sys.argv[2]))
print(len(row.model_dump_json()) + 1, flush=True)
while True:
    append(Path(sys.argv[1]), [row])
"""


def _spawn(script: str, *args, **kw) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-c", script, *map(str, args)], env=env, **kw)


def test_four_writers_800_rows(tmp_path):
    path = tmp_path / "candidates.jsonl"
    procs = [_spawn(_WRITER, path, w, 200) for w in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    got = load(CaseResult, path)
    assert got.skipped == [] and len(got.rows) == 800
    ids = [r.row_id for r in got.rows]
    assert len(set(ids)) == 800
    for w in range(4):  # each writer's rows appear whole and in its own order
        mine = [i for i in ids if i.startswith(f"w{w}-")]
        assert mine == sorted(mine) and len(mine) == 200
    assert path.read_bytes().endswith(b"\n") and path.read_bytes().count(b"\n") == 800


def _kill_mid_append(path: Path, size: int = 32 << 20, limit_s: float = 60.0) -> None:
    """Start a writer of huge rows and SIGKILL it while the file size is between row boundaries."""
    base = path.stat().st_size if path.exists() else 0
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        p = _spawn(_BIG_WRITER, path, size, stdout=subprocess.PIPE, text=True)
        row_len = int(p.stdout.readline())
        try:
            while p.poll() is None and time.monotonic() < deadline:
                now = path.stat().st_size if path.exists() else 0
                grown = now - base
                if grown > 0 and grown % row_len not in (0, 1):  # inside a write (1: the leading newline)
                    os.kill(p.pid, signal.SIGKILL)
                    p.wait()
                    if path.read_bytes()[-1:] != b"\n":
                        return
                    break  # the write finished between stat and kill: try again
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        base = path.stat().st_size
    raise AssertionError("could not kill the writer in the middle of an append")


def test_kill9_mid_append_leaves_a_loadable_ledger(tmp_path):
    path = tmp_path / "candidates.jsonl"
    append(path, [CaseResult(row_id=f"before{i}") for i in range(3)])
    _kill_mid_append(path)

    got = load(CaseResult, path)
    assert [r.row_id for r in got.rows[:3]] == ["before0", "before1", "before2"]
    assert all(r.row_id in ("big",) for r in got.rows[3:])
    torn = path.read_bytes().count(b"\n") + 1
    assert got.skipped == [(torn, "torn or invalid JSON")]
    assert len(load_dicts(path).skipped) == 1

    # The killed writer's lock is gone with it; the next append starts on a new line.
    t0 = time.monotonic()
    assert append(path, [CaseResult(row_id="after")]) == 2
    assert time.monotonic() - t0 < 10
    again = load(CaseResult, path)
    assert again.rows[-1].row_id == "after"
    assert len(again.rows) == len(got.rows) + 1
    assert again.skipped == got.skipped
    append(path, [CaseResult(row_id="after2")])
    assert [r.row_id for r in load(CaseResult, path).rows[-2:]] == ["after", "after2"]


def test_garbage_lines_are_reported_not_fatal(tmp_path):
    path = tmp_path / "candidates.jsonl"
    append(path, [CaseResult(row_id="a")])
    with open(path, "ab") as f:
        f.write(b'{"row_id": 5, "status": "nonsense"}\n\xff\xfe not json\n[1, 2]\n\n')
    append(path, [CaseResult(row_id="b")])
    got = load(CaseResult, path)
    assert [r.row_id for r in got.rows] == ["a", "b"]
    assert [n for n, _ in got.skipped] == [2, 3, 4]
