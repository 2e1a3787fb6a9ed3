"""ITERATIONS.md: render/parse round trip, appends that keep hand edits, `kopt log`."""

from __future__ import annotations

import os
import types
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import failure, kopt
from kopt import atomic
from kopt.errors import UsageError
from kopt.records import CaseResult
from kopt.store import journal, ledger
from kopt.store.journal import Entry
from kopt.store.vcs import candidate_hash
from kopt.workspace import log

pytestmark = pytest.mark.usefixtures("git_env")  # real git, isolated (conftest)





def sample() -> list[Entry]:
    return [
        Entry(number=1, title="baseline", sections={s: f"{s} text" for s in journal.SECTIONS}),
        Entry(number=2, title="split KV — 4 ways", sections={
            "Hypothesis": "more blocks\n\n- a\n- b", "Changes": "```\n## Iteration 9 — not a heading\n### Nor\n```",
            "Bench": "| case | runtime ms |\n|---:|---:|\n| 1 | 0.0100 |\n\nGeomean 1.2x", "Analysis": "",
            "Next": "try `T.Pipelined`"}),
    ]


def test_round_trip_fixed():
    text = journal.render(sample())
    assert journal.render(journal.parse(text)) == text
    assert journal.parse(text) == sample()
    assert "## Iteration 2 — split KV — 4 ways\n\n### Hypothesis\n\nmore blocks" in text
    assert journal.parse(journal.render([])) == []


_line = st.text(alphabet="abcXYZ019 |-*.`:_()#", max_size=30).filter(
    lambda s: not s.lstrip().startswith(("#", "```", "~~~")))
_body = st.lists(_line, max_size=6).map(lambda ls: "\n".join(ls).strip("\n"))
_entry = st.builds(
    lambda n, t, bodies: Entry(number=n, title=" ".join(t.split()), sections=dict(zip(journal.SECTIONS, bodies))),
    st.integers(1, 10_000), st.text(alphabet="abc 12-—.", max_size=20),
    st.lists(_body, min_size=5, max_size=5))


@settings(max_examples=150, deadline=None)
@given(st.lists(_entry, max_size=5), _body)
def test_round_trip_property(entries, extra):
    preamble = journal.PREAMBLE + ("\n\n" + extra if extra else "")
    text = journal.render(entries, preamble)
    doc = journal.parse_document(text)
    assert journal.render(doc.entries, doc.preamble) == text
    assert [e.number for e in doc.entries] == [e.number for e in entries]


def test_parse_tolerates_hand_edits():
    text = "# My log\n\n## Iteration 3 - hyphen title\n\nloose text\n### Hypothesis\nx\n## Iteration 4\n"
    e3, e4 = journal.parse(text)
    assert (e3.number, e3.title, e3.sections) == (3, "hyphen title", {"Hypothesis": "x"})
    assert (e4.number, e4.title, e4.sections) == (4, "", {})


def test_add_entry_keeps_hand_edits_and_is_atomic(tmp_path, monkeypatch):
    tmp_path = tmp_path / "j"
    tmp_path.mkdir()
    p = tmp_path / "ITERATIONS.md"
    hand = "# Log, edited by hand\n\n## Iteration 1 -  old style\nfree text\n"
    p.write_text(hand)
    calls = []
    real = os.replace
    monkeypatch.setattr(atomic.os, "replace", lambda a, b: (calls.append((a, b)), real(a, b)))
    journal.add_entry(p, Entry(number=2, title="new", sections={"Next": "x"}))
    assert p.read_text() == hand + "\n## Iteration 2 — new\n\n### Next\n\nx\n"
    assert calls and Path(calls[0][1]) == p and Path(calls[0][0]).parent == tmp_path
    journal.add_entry(p, Entry(number=2, title="redo", sections={}), replace=True)
    assert p.read_text() == hand + "\n## Iteration 2 — redo\n"
    assert [f.name for f in tmp_path.iterdir()] == ["ITERATIONS.md"], "no temp file left"


def test_write_atomic_failure_keeps_old_text(tmp_path, monkeypatch):
    tmp_path = tmp_path / "j"
    tmp_path.mkdir()
    p = tmp_path / "ITERATIONS.md"
    p.write_text("old\n")

    def boom(a, b):
        raise OSError("disk full")

    monkeypatch.setattr(atomic.os, "replace", boom)
    with pytest.raises(OSError):
        journal.write_atomic(p, "new\n")
    assert p.read_text() == "old\n" and [f.name for f in tmp_path.iterdir()] == ["ITERATIONS.md"]


@pytest.fixture
def ws(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "w"
    assert kopt("init", root).exit_code == 0
    monkeypatch.setenv("KOPT_WORKSPACE", str(root))
    return root


def _verdict(ws: Path, speedups: dict[int, float]) -> str:
    h, cid = candidate_hash(ws / "solution" / "tilelang" / "run_kernel.py")
    ledger.append(ws / "candidates.jsonl", [CaseResult(
        row_id=uuid.uuid4().hex, mode="verdict", candidate_hash=h, candidate_id=cid, case=c, correct=True,
        compiled=True, runtime_ms=0.1 / s, ref_runtime_ms=0.1, speedup=s) for c, s in speedups.items()])
    return cid


def test_log_entry_shape(ws):
    p = ws / "solution" / "tilelang" / "run_kernel.py"
    p.write_text(p.read_text() + "# edit\n")
    cid = _verdict(ws, {1: 2.0, 10: 0.5})
    res = kopt("log", "--hypothesis", "Tile 64 keys\nbecause L2", "--analysis", "a", "--next", "n")
    assert res.exit_code == 0, (res.stdout, res.exception)
    (e,) = journal.parse((ws / "ITERATIONS.md").read_text())
    assert (e.number, e.title, list(e.sections)) == (1, "Tile 64 keys", list(journal.SECTIONS))
    assert "solution/tilelang/run_kernel.py | 1 +" in e.sections["Changes"]
    assert "| 1 | 0.0500 | 0.1000 | 2.000x | NA |  | ok |" in e.sections["Bench"]
    assert "| 10 | 0.2000 | 0.1000 | 0.500x | NA |  | ok |" in e.sections["Bench"]
    assert f"`{cid}` (verdict): geomean speedup 1.000x over 2 correct case(s); no previous best" in e.sections["Bench"]


def test_log_pending_entry_refused_then_replaced(ws):
    assert kopt("log", "--title", "a").exit_code == 0
    res = kopt("log", "--title", "b")
    code, err = failure(res)
    assert code == 2 and err.count("\n") == 1 and "already logged" in err
    assert kopt("log", "--title", "b", "--replace").exit_code == 0
    assert [(e.number, e.title) for e in journal.parse((ws / "ITERATIONS.md").read_text())] == [(1, "b")]


def test_log_without_flags_needs_a_terminal(ws):
    res = kopt("log")
    code, err = failure(res)
    assert code == 2 and "--hypothesis" in err


def test_log_opens_editor_in_a_terminal(ws, monkeypatch):
    from kopt.cli import common

    tty = types.SimpleNamespace(isatty=lambda: True)
    monkeypatch.setattr("kopt.cli.log.sys", types.SimpleNamespace(stdin=tty, stdout=tty))
    seen = {}

    def fake_edit(text, suffix=".md"):
        seen["template"] = text
        return text.replace("— iteration 1", "— from the editor").replace(
            "### Hypothesis\n", "### Hypothesis\n\nwritten in $EDITOR\n")

    monkeypatch.setattr(common, "edit_text", fake_edit)
    assert kopt("log").exit_code == 0
    assert seen["template"].startswith("## Iteration 1 — iteration 1\n\n### Hypothesis\n\n### Changes")
    (e,) = journal.parse((ws / "ITERATIONS.md").read_text())
    assert (e.title, e.sections["Hypothesis"]) == ("from the editor", "written in $EDITOR")
    monkeypatch.setattr(common, "edit_text", lambda text, suffix=".md": None)
    res = kopt("log", "--replace")
    code, err = failure(res)
    assert code == 2 and "editor closed" in err
    assert journal.parse((ws / "ITERATIONS.md").read_text())[0].title == "from the editor"


def test_log_outside_git_falls_back_to_last_entry(tmp_path, monkeypatch):
    ws = tmp_path / "plain"
    ws.mkdir()
    monkeypatch.setenv("KOPT_WORKSPACE", str(ws))
    (ws / "ITERATIONS.md").write_text(journal.render([Entry(number=5, title="old")]))
    e = log.log_iteration(ws, hypothesis="h")
    assert e.number == 6 and "not a git repository" in e.sections["Changes"]
    assert "no bench or verdict rows of candidate" in e.sections["Bench"] and "not judged" in e.sections["Bench"]
    with pytest.raises(UsageError, match="editor closed"):
        log.log_iteration(ws, hypothesis="h", edit=lambda t: None)


def test_log_shows_the_candidates_ab_readings_against_an_earlier_file(ws):
    """An iteration screened by an A/B (`kopt peers --peers OLD.py`) and never benched: its entry holds the A/B
    table (its time, the earlier candidate's, the ratio and its CI), says why there are no bench rows, and is not
    judged."""
    import shutil

    from kopt.candidate import candidate_id

    old = ws / "old" / "tilelang"
    shutil.copytree(ws / "solution" / "tilelang", old)
    p = ws / "solution" / "tilelang" / "run_kernel.py"
    p.write_text(p.read_text() + "# edit\n")
    res = kopt("peers", "--device", "cpu", "--case", "2", "--quick", "--peers", str(old / "run_kernel.py"))
    assert res.exit_code == 0, (res.stdout, res.exception)
    e = log.log_iteration(ws, hypothesis="h")
    bench = e.sections["Bench"]
    name = f"cand-{candidate_id(old / 'run_kernel.py')}"
    assert "its A/B readings below" in bench and "not judged" in bench
    (line,) = [x for x in bench.splitlines() if x.startswith("| 2 |")]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[3] == "cpu" and cells[5] == f"`{name}`"
    # the table shows the ledger's own pair, whatever the timings were (no timing decides this test)
    (p,) = ledger.load(CaseResult, ws / "candidates.jsonl").rows[-1].peers
    assert cells[4] == f"{p.timing.median_ms:.4f}" and cells[6] == f"{p.ref_timing.median_ms:.4f}"
    assert cells[7] == f"{p.speedup:.3f}x" and cells[8] == f"{p.speedup_ci[0]:.3f}-{p.speedup_ci[1]:.3f}"
