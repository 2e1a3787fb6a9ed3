"""Lean trajectory snapshots: deltas exact to the byte, `kopt revert` restoring any snapshot byte for byte on a real
git repository, schema 1 snapshots migrated without a byte lost."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import failure, kopt
from kopt.cli.main import app
from kopt.errors import WorkspaceError
from kopt.store import delta, trajectory, vcs

SOL = Path("solution") / "tilelang"


def test_delta_roundtrip_is_exact():
    """Texts without a final newline, CRLF, lone CR, unicode, binary, empty, deleted, new and mode-only changes."""
    old = {"a.py": (b"x = 1\ny = 2\nz = 3", 0o644), "b.txt": (b"one\r\ntwo\r\n", 0o644),
           "c.bin": (bytes(range(256)), 0o644), "d.sh": (b"echo hi\n", 0o644), "gone.py": (b"bye\n", 0o644),
           "e.md": (b"", 0o644), "f.py": ("h\u00e9\u2028llo\n".encode(), 0o644)}
    new = {"a.py": (b"x = 1\ny = 20\nz = 3\n", 0o644), "b.txt": (b"one\r\nthree\rfour\r\n", 0o644),
           "c.bin": (bytes(range(255, -1, -1)), 0o644), "d.sh": (b"echo hi\n", 0o755), "e.md": (b"now\n", 0o644),
           "f.py": ("h\u00e9\u2028llo\nw\u00f6rld".encode(), 0o644), "new.py": (b"fresh\n", 0o600),
           "latin.txt": ("caf\u00e9".encode("latin-1"), 0o644)}
    d = delta.diff(old, new)
    assert delta.apply(old, json.loads(json.dumps(d))) == new
    assert d["files"]["gone.py"] is None and "b64" in d["files"]["latin.txt"] and "ops" in d["files"]["a.py"]
    assert d["files"]["d.sh"] == {"mode": 0o755, "ops": []}
    assert delta.diff(new, new) == {"files": {}}
    with pytest.raises(ValueError, match="out of the base"):
        delta.apply({"a.py": (b"short\n", 0o644)}, {"files": {"a.py": {"mode": 0o644, "ops": [[5, 9, []]]}}})


@pytest.fixture
def ws(tmp_path, monkeypatch, git_env, no_figures) -> Path:
    root = tmp_path / "w"
    assert CliRunner().invoke(app, ["init", str(root)]).exit_code == 0
    monkeypatch.setenv("KOPT_WORKSPACE", str(root))
    return root


def _iteration(ws: Path, n: int) -> None:
    """Iteration n's changes: edits, a new helper, a deleted one, a binary file, an executable bit, a text without
    a final newline, CRLF lines, a tuning table."""
    k = ws / SOL / "run_kernel.py"
    k.write_bytes(k.read_bytes() + f"# iteration {n}\n".encode())
    if n == 1:
        (ws / SOL / "helper.py").write_text("X = 1\n")
        (ws / SOL / "blob.bin").write_bytes(os.urandom(3000))
        (ws / SOL / "crlf.txt").write_bytes(b"a\r\nb\r\n")
    if n == 2:
        (ws / SOL / "helper.py").unlink()
        (ws / SOL / "tail.py").write_bytes(b"no final newline")
        (ws / SOL / "run.sh").write_text("#!/bin/sh\necho run\n")
        (ws / SOL / "run.sh").chmod(0o755)
    if n == 3:
        (ws / SOL / "blob.bin").write_bytes(os.urandom(3000))
        (ws / SOL / "crlf.txt").write_bytes(b"a\r\nc\r\nb")
        table = ws / "results" / "tilelang" / "tuning.csv"
        table.parent.mkdir(parents=True, exist_ok=True)
        table.write_text("device,case,config\nH200,10,{}\n")
    if n == 4:
        (ws / SOL / "run.sh").chmod(0o644)
        (ws / SOL / "tail.py").write_bytes(b"no final newline\nstill none")
    if n == 5:  # the tuning table is part of what the candidate runs
        (ws / "results" / "tilelang" / "tuning.csv").write_text("device,case,config\nH200,10,{\"x\":1}\n")


def _committed(repo, sha: str) -> dict[str, tuple[bytes, bool]]:
    """solution/ as git holds it at commit sha: path -> (bytes, executable)."""
    out = {}
    for line in repo.git.ls_tree("-r", sha, "--", "solution").splitlines():
        mode, _, blob, path = line.split(None, 3)
        out[path] = (repo.odb.stream(bytes.fromhex(blob)).read(), mode == "100755")
    return out


def _on_disk(ws: Path) -> dict[str, tuple[bytes, bool]]:
    files = {p.relative_to(ws).as_posix(): p for p in (ws / "solution").rglob("*") if p.is_file()}
    return {k: (p.read_bytes(), bool(p.stat().st_mode & stat.S_IXUSR)) for k, p in files.items()
            if "__pycache__" not in k}


def test_revert_restores_every_snapshot_byte_for_byte(ws):
    """Five iterations (the first snapshot whole, the others deltas); reverting to each restores solution/ exactly
    as its [iter N] commit holds it, executable bits included, whatever was reverted before."""
    import git

    repo = git.Repo(ws)
    commits = {}
    for n in range(1, 6):
        _iteration(ws, n)
        res = kopt("commit", "-m", f"iteration {n}")
        assert res.exit_code == 0, (res.stdout, res.exception)
        commits[n] = repo.head.commit.hexsha
    snaps = trajectory.snapshots(ws)
    assert [m.base is None for _, m in snaps] == [True, False, False, False, False]
    assert all((p / "files.json").is_file() and not (p / "solution").exists() for p, _ in snaps[1:])
    table = ws / "results" / "tilelang" / "tuning.csv"
    tables = {n: repo.git.show(f"{commits[n]}:results/tilelang/tuning.csv") + "\n" for n in (3, 4, 5)}
    assert tables[3] == tables[4] != tables[5]
    for n in (1, 3, 5, 2, 4, 1):
        res = kopt("revert", str(n))
        assert res.exit_code == 0, (res.stdout, res.exception)
        assert _on_disk(ws) == _committed(repo, commits[n]), n
        assert _committed(repo, "HEAD") == _committed(repo, commits[n])
        assert repo.head.commit.summary.startswith(f"[revert] solution from iter {n}")
        if n >= 3:  # the snapshot holds the table it was measured with: restored and committed with solution/
            assert table.read_text() == tables[n] and "(and its tuning table)" in repo.head.commit.summary
        assert not repo.is_dirty(path="results"), "the views (STATUS.md, report, plots) are remade into the commit"
    out = ws.parent / "iter3"
    res = kopt("revert", "3", "--to", out)                       # a folder to run iteration 3 from, no commit
    assert res.exit_code == 0 and repo.head.commit.summary.startswith("[revert] solution from iter 1"), res.stdout
    assert _on_disk(out) == _committed(repo, commits[3])
    assert (out / "results" / "tilelang" / "tuning.csv").read_text() == "device,case,config\nH200,10,{}\n"


def test_a_broken_chain_or_a_changed_file_is_an_error_not_a_wrong_restore(ws):
    for n in (1, 2, 3):
        _iteration(ws, n)
        assert kopt("commit", "-m", f"iteration {n}").exit_code == 0
    (one, _), (two, _), (three, _) = trajectory.snapshots(ws)
    (one / "solution" / "tilelang" / "helper.py").write_text("X = 2\n")     # a hand edit of the whole snapshot
    with pytest.raises(WorkspaceError, match=f"snapshot {one.name}: restored files differ"):
        trajectory.files(three)
    assert "restored files differ" in failure(kopt("revert", "3"))[1]
    shutil.rmtree(two)
    with pytest.raises(WorkspaceError, match=f"a delta against {two.name}, which is missing"):
        trajectory.files(three)
    _iteration(ws, 4)                         # the next snapshot cannot be a delta of a broken one: whole
    assert kopt("commit", "-m", "iteration 4").exit_code == 0
    four, meta = trajectory.snapshots(ws)[-1]
    assert meta.base is None and trajectory.files(four) == trajectory.workspace_files(ws)


def test_a_whole_snapshot_again_once_the_deltas_outgrow_the_files(ws):
    """The chain of deltas back to a whole snapshot never holds more bytes than the files themselves."""
    size = sum(len(d) for d, _ in trajectory.workspace_files(ws).values())
    for n in range(1, 6):  # each rewrite a third of what the files then hold: a few deltas outgrow them
        (ws / SOL / "big.txt").write_text(os.urandom(size // 4).hex() + "\n")
        assert kopt("commit", "-m", f"rewrite {n}").exit_code == 0
    snaps = trajectory.snapshots(ws)
    assert snaps[0][1].base is None and any(m.base is None for _, m in snaps[1:])
    for p, m in snaps:
        assert delta.manifest(trajectory.files(p)) == m.files
        chain, at = 0, p
        while (at / "files.json").is_file():
            chain += (at / "files.json").stat().st_size
            at = at.parent / json.loads((at / "meta.json").read_text())["base"]
        assert chain <= sum(len(d) for d, _ in trajectory.files(p).values())


def _schema1(ws: Path, n: int, rows: list[dict]) -> Path:
    """A snapshot as kopt wrote them before schema 2: solution/ and the tuning tables whole, results.json."""
    snap = ws / "trajectory" / f"{n}-20260101T00000{n}-old-{n}"
    for rel, (data, mode) in trajectory.workspace_files(ws).items():
        (snap / rel).parent.mkdir(parents=True, exist_ok=True)
        (snap / rel).write_bytes(data)
        (snap / rel).chmod(mode)
    (snap / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
    (snap / "iteration.md").write_text(f"## Iteration {n} — old\n")
    (snap / "notes.txt").write_text("kept\n")
    meta = {"schema_version": 1, "iteration": n, "label": f"old-{n}", "description": "old", "created": "2026-01-01",
            "candidate_id": "c0ffee000000", "geomean": 1.5, "n_cases": len(rows), "verdict_rows": len(rows),
            "failed": False, "device": "H200"}
    (snap / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return snap


def test_migrate_schema1_snapshots_keeps_every_byte(ws):
    """Whole schema 1 snapshots become a whole first one and deltas; each restores the bytes it held, its rows are
    kept by id, its other files stay; a dry run writes nothing; a second run has nothing to do."""
    originals = {}
    for n in (1, 2, 3):
        _iteration(ws, n)
        snap = _schema1(ws, n, [{"row_id": f"r{n}-{c}", "case": c} for c in (4, 5)])
        originals[snap.name] = trajectory.files(snap)
    before = {p.relative_to(ws).as_posix(): p.read_bytes() for p in (ws / "trajectory").rglob("*") if p.is_file()}
    dry = trajectory.migrate(ws, dry_run=True)
    assert [m.name for m in dry] == list(originals)
    assert {p.relative_to(ws).as_posix(): p.read_bytes() for p in (ws / "trajectory").rglob("*")
            if p.is_file()} == before
    done = trajectory.migrate(ws)
    assert [(m.name, m.base) for m in done] == [(m.name, m.base) for m in dry]
    assert done[0].base is None and done[1].base == done[0].name and done[2].after < done[2].before
    for p, m in trajectory.snapshots(ws):
        assert trajectory.files(p) == originals[p.name] and m.schema_version == 2
        assert m.rows == [f"r{m.iteration}-4", f"r{m.iteration}-5"] and m.geomean == 1.5
        assert not (p / "results.json").exists() and (p / "notes.txt").read_text() == "kept\n"
        assert (p / "iteration.md").read_text() == f"## Iteration {m.iteration} — old\n"
    assert trajectory.migrate(ws) == []
    assert not [p for p in (ws / "trajectory").iterdir() if p.name.startswith(".tmp")]
    assert vcs.next_iteration(ws) == 1  # migration commits nothing
