"""Ledger schema: rows validate, torn lines are skipped and reported, rows of older schemas still load."""

import json

from kopt.records import CaseResult, Status
from kopt.workspace.ledger import append, load, load_dicts


def test_append_and_load_roundtrip(tmp_path):
    f = tmp_path / "c.jsonl"
    rows = [CaseResult(row_id=f"r{i}", case=i, status=Status.ok, runtime_ms=0.1 * (i + 1)) for i in range(3)]
    assert append(f, rows) == 3
    got = load(CaseResult, f)
    assert [r.row_id for r in got.rows] == ["r0", "r1", "r2"] and not got.skipped
    assert json.loads(f.read_text().splitlines()[0])["schema_version"] == 1


def test_torn_line_reported_and_next_append_starts_fresh(tmp_path):
    f = tmp_path / "c.jsonl"
    append(f, [CaseResult(row_id="a", case=1)])
    with open(f, "a") as fh:
        fh.write('{"row_id": "torn", "ca')
    append(f, [CaseResult(row_id="b", case=2)])
    got = load(CaseResult, f)
    assert [r.row_id for r in got.rows] == ["a", "b"]
    assert got.skipped == [(2, "torn or invalid JSON")]


def test_schema_errors_skipped_not_fatal(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text('{"row_id": "x", "case": 1, "runtime_ms": "fast"}\n{"row_id": "y", "case": 2, "old_field": 1}\n')
    got = load(CaseResult, f)
    assert [r.row_id for r in got.rows] == ["y"] and got.skipped[0][0] == 1
    assert len(load_dicts(f).rows) == 2


def test_unwritable_ledger_fails_before_any_work(tmp_path):
    import pytest

    from kopt.errors import LedgerError
    from kopt.workspace.ledger import check_writable

    (tmp_path / "c.jsonl").mkdir()
    with pytest.raises(LedgerError, match="cannot write ledger"):
        check_writable(tmp_path / "c.jsonl")
    check_writable(tmp_path / "sub" / "ok.jsonl")
    assert (tmp_path / "sub" / "ok.jsonl").exists()
