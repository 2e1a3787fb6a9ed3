"""The lean ledger (schema 2): a run's shared fields once, older rows in compressed generations, every row read
back as it was written; `kopt candidates`, `kopt status` and `kopt report` answer the same before and after a
schema 1 ledger (a sample of the project's own, tests/fixtures/ledger-schema1-sample.jsonl.xz) is compacted."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

import pytest

from conftest import kopt
from kopt.records import CaseResult
from kopt.store import lean, ledger

SAMPLE = Path(__file__).resolve().parents[2] / "fixtures" / "ledger-schema1-sample.jsonl.xz"


def _dump(rows) -> list[str]:
    return [json.dumps(r) for r in rows]


def test_encode_stores_shared_fields_once_and_reads_back_every_row_exactly():
    base = {"schema_version": 1, "row_id": "", "run_id": "r1", "hypothesis": "h" * 300, "case": 0, "n": 1}
    rows = [dict(base, row_id=f"a{c}", case=c) for c in range(4)]
    rows[2]["n"] = 1.0                                    # 1.0 is not 1: its own value, not the run's
    rows.insert(1, dict(base, row_id="b", run_id="r2"))   # another run in between (one row: whole)
    rows.append({"row_id": "c", "run_id": None, "case": 9})
    rows.append({"run_id": "r1", "row_id": "d", "case": 5, "hypothesis": "h" * 300})  # other keys: whole
    lines = lean.encode([*rows[:3], "{torn", *rows[3:]])
    assert sum("h" * 300 in line for line in lines) == 3  # r1's record, r2's whole row, the other-keys row
    back = list(lean.decode("\n".join(lines)))
    assert _dump(r for _, _, r, _ in back if r is not None) == _dump(rows)
    assert [list(r) for _, _, r, _ in back if r is not None] == [list(r) for r in rows]    # key order kept
    assert [(line, why) for _, line, r, why in back if r is None] == [("{torn", "torn or invalid JSON")]
    assert json.loads(lines[lines.index("{torn") + 1])["own"]["n"] == 1.0
    orphan = list(lean.decode(next(line for line in lines if line.startswith('{"schema_version":2,"of"'))))
    assert orphan[0][2] is None and "without its run record" in orphan[0][3]


def _sample(path: Path) -> None:
    path.write_bytes(lzma.decompress(SAMPLE.read_bytes()))
    with open(path, "a") as f:
        f.write('{"row_id": "torn", "ca\n')  # as a writer killed mid-append leaves it


def test_compact_archives_older_rows_and_every_reader_gets_them_back(tmp_path):
    path = tmp_path / "candidates.jsonl"
    _sample(path)
    rows, models = ledger.load_dicts(path), ledger.load(CaseResult, path)
    size = path.stat().st_size
    res = ledger.compact(path, archive_at=1 << 40)                      # lean, nothing archived
    assert res.changed and res.rows == len(rows.rows) and res.after < 0.75 * size and res.generation is None
    res = ledger.compact(path, archive_at=64 << 10, keep=32 << 10)       # older rows to generation 1
    assert res.generation == tmp_path / "candidates.archive" / "0001.jsonl.xz" and res.archived > 200
    assert path.stat().st_size < 64 << 10 and res.generation.stat().st_size < size / 8
    again = ledger.load_dicts(path)
    assert _dump(again.rows) == _dump(rows.rows) and again.skipped == [(len(path.read_text().splitlines()),
                                                                        "torn or invalid JSON")]
    assert [m.model_dump() for m in ledger.load(CaseResult, path).rows] == [m.model_dump() for m in models.rows]
    assert not ledger.compact(path, archive_at=64 << 10, keep=32 << 10).changed      # already lean: untouched
    new = [CaseResult(row_id=f"n{i}", run_id="late", case=i, hypothesis="x" * 500) for i in range(3)]
    ledger.append(path, new)                                                       # appends stay whole rows
    assert json.loads(path.read_text().splitlines()[-1])["row_id"] == "n2"
    ledger.compact(path, archive_at=8 << 10, keep=4 << 10)
    assert [p.name for p in ledger.generations(path)] == ["0001.jsonl.xz", "0002.jsonl.xz"]
    assert _dump(ledger.load_dicts(path).rows) == _dump(rows.rows + [r.model_dump(mode="json") for r in new])


def test_a_compaction_cut_short_between_its_two_files_is_healed(tmp_path):
    """The new generation is written first: a crash before the file is replaced leaves the archived rows in both;
    the next compaction drops them from the file, and no row is lost or doubled."""
    path = tmp_path / "candidates.jsonl"
    _sample(path)
    whole = path.read_bytes()
    want = _dump(ledger.load_dicts(path).rows)
    ledger.compact(path, archive_at=64 << 10, keep=32 << 10)
    done = path.read_bytes()
    path.write_bytes(whole)                                  # as if the file's replace never happened
    assert len(ledger.load_dicts(path).rows) > len(want)
    res = ledger.compact(path, archive_at=64 << 10, keep=32 << 10)
    assert _dump(ledger.load_dicts(path).rows) == want and res.generation is None and path.read_bytes() == done


def test_import_reads_a_lean_copy_and_knows_the_archived_rows(tmp_path):
    """A device run's copy of a lean ledger gives up only the rows this one lacks (its archived rows count as
    held), each appended whole."""
    dest, other = tmp_path / "here" / "candidates.jsonl", tmp_path / "device" / "candidates.jsonl"
    for p in (dest, other):
        p.parent.mkdir()
        _sample(p)
    ledger.compact(dest, archive_at=64 << 10, keep=32 << 10)
    new = [CaseResult(row_id=f"gpu{i}", run_id="gpu-run", case=4 + i, hypothesis="device") for i in range(2)]
    ledger.append(other, new)
    ledger.compact(other, archive_at=1 << 40)
    res = ledger.import_rows(CaseResult, dest, other)
    assert [r.row_id for r in res.added] == ["gpu0", "gpu1"] and res.present == len(ledger.load_dicts(other).rows) - 2
    assert [json.loads(x)["row_id"] for x in dest.read_text().splitlines()[-2:]] == ["gpu0", "gpu1"]


def _answers(ws: Path, tag: str) -> dict[str, str]:
    out = {}
    for args in (("candidates",), ("candidates", "--json"), ("candidates", "--case", "10"),
                 ("candidates", "--csv", "--device", "H200"), ("status", "--no-record"),
                 ("status", "--json", "--no-record"), ("status", "--device", "cpu", "--no-record")):
        res = kopt(*args)
        assert res.exit_code == 0, (args, res.output, res.exception)
        out[" ".join(args)] = res.stdout
    res = kopt("report", "--out", ws / f"report-{tag}.html")
    assert res.exit_code == 0, (res.output, res.exception)
    out["report"] = (ws / f"report-{tag}.html").read_text()
    return out


def test_candidates_status_and_report_answer_the_same_after_compaction(workspace, monkeypatch):
    """Today's ledger format (schema 1: whole rows) against the lean one with an archived generation."""
    _sample(workspace / "candidates.jsonl")
    before = _answers(workspace, "before")
    assert json.loads(before["candidates --json"])["candidates"] and "skipped_lines" in before["candidates --json"]
    monkeypatch.setattr(ledger, "ARCHIVE_AT", 64 << 10)
    monkeypatch.setattr(ledger, "KEEP", 32 << 10)
    res = kopt("compact")
    assert res.exit_code == 0, (res.output, res.exception)
    assert "older rows went to candidates.archive/0001.jsonl.xz" in res.stdout
    assert (workspace / "candidates.archive" / "0001.jsonl.xz").is_file()
    after = _answers(workspace, "after")
    for k in before:
        assert after[k] == before[k], k


@pytest.mark.parametrize("dry", [True, False])
def test_compact_command_dry_run_writes_nothing(workspace, dry):
    path = workspace / "candidates.jsonl"
    _sample(path)
    raw = path.read_bytes()
    res = kopt("compact", *(["--dry-run"] if dry else []), "--json")
    assert res.exit_code == 0, (res.output, res.exception)
    d = json.loads(res.stdout)
    assert d["ledger"]["before"] == len(raw) and d["ledger"]["after"] < len(raw) and d["snapshots"] == []
    assert (path.read_bytes() == raw) is dry
