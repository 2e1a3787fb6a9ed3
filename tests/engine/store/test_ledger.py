"""Ledger schema: rows validate, torn lines are skipped and reported, rows of older schemas still load."""

import json

from kopt.records import CaseResult, Status
from kopt.store.ledger import append, load, load_dicts


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
    from kopt.store.ledger import check_writable

    (tmp_path / "c.jsonl").mkdir()
    with pytest.raises(LedgerError, match="cannot write ledger"):
        check_writable(tmp_path / "c.jsonl")
    check_writable(tmp_path / "sub" / "ok.jsonl")
    assert (tmp_path / "sub" / "ok.jsonl").exists()


def _rows(*ids):
    """Rows with a fixed timestamp: two calls give the same bytes for the same ids, whatever second each runs in."""
    return [CaseResult(row_id=i, run_id="run1", mode="verdict", candidate_id="c1", case=n,
                       timestamp="2026-12-07T12:00:00+00:00") for n, i in enumerate(ids, 1)]


def test_import_appends_only_the_rows_not_yet_held_in_order_and_verbatim(tmp_path):
    """Another copy of the ledger (a device run's: this one's rows plus new ones) gives up only its new rows,
    appended in their order and byte for byte; a second import adds nothing; a dry run writes nothing."""
    from kopt.store.ledger import import_rows

    dest, other = tmp_path / "candidates.jsonl", tmp_path / "device.jsonl"
    append(dest, _rows("a", "b"))
    append(other, _rows("a", "b", "c", "d"))
    before = dest.read_bytes()
    dry = import_rows(CaseResult, dest, other, dry_run=True)
    assert [r.row_id for r in dry.added] == ["c", "d"] and dry.present == 2 and dest.read_bytes() == before
    res = import_rows(CaseResult, dest, other)
    assert [r.row_id for r in res.added] == ["c", "d"] and res.present == 2 and not res.skipped
    assert dest.read_bytes() == other.read_bytes()
    again = import_rows(CaseResult, dest, other)
    assert not again.added and again.present == 4 and dest.read_bytes() == other.read_bytes()


def test_import_reads_the_ledger_inside_a_campaign_archive_and_refuses_bad_lines(tmp_path):
    """A campaign's .tgz (logs/candidates.jsonl inside) is read in place; a torn line or a row of the wrong
    schema is refused and reported by line, the valid rows still come in."""
    import tarfile

    from kopt.store.ledger import import_rows

    logs = tmp_path / "logs"
    logs.mkdir()
    src = logs / "candidates.jsonl"
    append(src, _rows("x"))
    with open(src, "a") as fh:
        fh.write('{"row_id": "y", "case": 2, "runtime_ms": "fast"}\n{"row_id": "z", "ca\n')
    append(src, _rows("w"))
    (logs / "verify.out").write_text("VERDICT:pass\n")
    archive = tmp_path / "campaign.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(logs, arcname="logs")
    dest = tmp_path / "ws" / "candidates.jsonl"
    res = import_rows(CaseResult, dest, archive)
    assert [r.row_id for r in res.added] == ["x", "w"]
    assert [n for n, _ in res.skipped] == [2, 3] and res.skipped[0][1].startswith("schema")
    assert res.source.endswith("logs/candidates.jsonl")
    assert [r.row_id for r in load(CaseResult, dest).rows] == ["x", "w"]


def test_import_refuses_what_is_not_a_ledger(tmp_path):
    """A missing file, a file with no row in it and an archive without exactly one candidates.jsonl are one
    LedgerError each (exit code 2), and the ledger is left as it was."""
    import tarfile

    import pytest

    from kopt.errors import LedgerError
    from kopt.store.ledger import import_rows

    dest = tmp_path / "candidates.jsonl"
    append(dest, _rows("a"))
    before = dest.read_bytes()
    notes = tmp_path / "notes.md"
    notes.write_text("# not a ledger\n\nsome text\n")
    empty_tar = tmp_path / "x.tgz"
    with tarfile.open(empty_tar, "w:gz") as tar:
        tar.add(notes, arcname="logs/notes.md")
    for bad, msg in ((tmp_path / "missing.jsonl", "no such file"), (notes, "not a ledger"),
                     (empty_tar, "want one candidates.jsonl")):
        with pytest.raises(LedgerError, match=msg) as e:
            import_rows(CaseResult, dest, bad)
        assert e.value.exit_code == 2
    assert dest.read_bytes() == before


def test_import_command_end_to_end(tmp_path, workspace):
    """`kopt import` in a workspace: says per run what it appended and the totals; a bad path is one stderr line
    and exit code 2."""
    import os
    import subprocess
    import sys

    ws = workspace  # conftest's throwaway workspace (KOPT_WORKSPACE)
    append(ws / "candidates.jsonl", _rows("a"))
    other = tmp_path / "device.jsonl"
    append(other, _rows("a", "b", "c"))
    env = dict(os.environ, KOPT_WORKSPACE=str(ws))
    r = subprocess.run([sys.executable, "-m", "kopt", "import", str(other)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "run run1 verdict candidate c1: 2 row(s)" in r.stdout
    assert "appended 2 row(s) to candidates.jsonl" in r.stdout and "(1 already there, 0 refused)" in r.stdout
    assert [row.row_id for row in load(CaseResult, ws / "candidates.jsonl").rows] == ["a", "b", "c"]
    r = subprocess.run([sys.executable, "-m", "kopt", "import", str(tmp_path / "nope.tgz")], capture_output=True,
                       text=True, env=env)
    assert r.returncode == 2 and r.stderr.strip() == f"kopt: error: no such file: {tmp_path / 'nope.tgz'}"


def test_import_of_a_campaign_archive_brings_its_new_results_files(tmp_path, workspace):
    """`kopt import campaign.tgz` also writes the archive's results/ files the workspace lacks, leaves one it holds
    with other bytes (named on stderr, never overwritten) and never takes the views kopt plot / report make."""
    import os
    import subprocess
    import sys
    import tarfile

    ws = workspace
    dev = tmp_path / "device"
    (dev / "logs").mkdir(parents=True)
    append(dev / "logs" / "candidates.jsonl", _rows("d1"))
    (dev / "results" / "tilelang" / "plots").mkdir(parents=True)
    (dev / "results" / "tilelang" / "peers-h200-2026-12-05.csv").write_text("device,case\nH200,10\n")
    (dev / "results" / "e2e-h200.jsonl").write_text('{"model": "m"}\n')
    (dev / "results" / "STATUS.md").write_text("the device's view\n")
    (dev / "results" / "tilelang" / "plots" / "speedup.png").write_bytes(b"png")
    (ws / "results").mkdir(exist_ok=True)
    (ws / "results" / "e2e-h200.jsonl").write_text('{"model": "here"}\n')
    status_before = (ws / "results" / "STATUS.md").read_bytes() if (ws / "results" / "STATUS.md").exists() else None
    archive = tmp_path / "campaign.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(dev / "logs", arcname="logs")
        tar.add(dev / "results", arcname="results")
    env = dict(os.environ, KOPT_WORKSPACE=str(ws))
    r = subprocess.run([sys.executable, "-m", "kopt", "import", str(archive)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert (ws / "results" / "tilelang" / "peers-h200-2026-12-05.csv").read_text() == "device,case\nH200,10\n"
    assert "wrote results/tilelang/peers-h200-2026-12-05.csv" in r.stdout
    assert (ws / "results" / "e2e-h200.jsonl").read_text() == '{"model": "here"}\n'  # not overwritten
    assert "results/e2e-h200.jsonl differs from the archive's copy; left as is" in r.stderr
    st = ws / "results" / "STATUS.md"
    assert (st.read_bytes() if st.exists() else None) == status_before  # a view: never taken
    assert not (ws / "results" / "tilelang" / "plots" / "speedup.png").exists()
    assert "results/: 1 file(s) written, 0 already the same, 1 left as is" in r.stdout
