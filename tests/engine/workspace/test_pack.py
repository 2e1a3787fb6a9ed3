"""`kopt pack`: what travels to a GPU host (tracked files, untracked files git does not ignore, carried folders)
measured as git lists it; the lean copy holds what a run reads, names the commit it came from, and fits."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import failure, kopt
from kopt.cli.main import app
from kopt.store import vcs
from kopt.workspace import pack

pytestmark = pytest.mark.usefixtures("git_env")


@pytest.fixture
def ws(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "w"
    assert CliRunner().invoke(app, ["init", str(root)]).exit_code == 0
    monkeypatch.setenv("KOPT_WORKSPACE", str(root))
    (root / "trajectory" / "1-x").mkdir(parents=True)
    (root / "trajectory" / "1-x" / "meta.json").write_text("{}\n" * 5000)
    (root / "results" / "tilelang").mkdir(parents=True, exist_ok=True)
    (root / "results" / "tilelang" / "tuning.csv").write_text("device,case,config\n")
    (root / "results" / "tilelang" / "report.html").write_text("<html>" + "x" * 9000)
    (root / "results" / "calibration-H200.json").write_text("{}\n")
    (root / "workflows" / "campaign-h200.yaml").write_text("steps:\n  - {name: doctor, run: kopt doctor}\n")
    (root / "workflows" / "pending").mkdir()
    (root / "workflows" / "pending" / "change.patch").write_text("a candidate patch a campaign step times\n")
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run(["git", "commit", "-qm", "history"], cwd=root, check=True)
    (root / "notes.txt").write_text("untracked, not ignored: it travels\n")
    (root / "x.lock").write_text("ignored: it stays\n")
    (root / ".site").mkdir()
    (root / ".site" / "lib.so").write_bytes(os.urandom(4096))
    (root / ".git" / "info" / "exclude").write_text(".site/\n")
    return root


def _git_bytes(root: Path) -> int:
    """What `git ls-files` and `git ls-files --others --exclude-standard` name, summed as du -b does."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         capture_output=True, check=True).stdout.decode().split("\0")
    return sum(os.lstat(root / n).st_size for n in set(out) if n)


def test_measure_counts_what_git_sends_and_the_carried_folders(ws):
    t = pack.measure(ws, (Path(".site"),), limit=1 << 20)
    assert t.tree_bytes == _git_bytes(ws) and t.carried_bytes == 4096 and t.total == t.tree_bytes + 4096
    names = {e.name for e in t.entries}
    assert {"notes.txt", "trajectory/", "results/", ".site"} <= names and "x.lock" not in names
    assert t.lean_bytes < t.tree_bytes - 9000 - 10000           # the trajectory and the report stay behind
    d = pack.measure(ws, (Path(".site"),), limit=t.total - 1).to_dict()
    assert d["fits"] is False and d["lean_fits"] is True
    assert "nothing to carry" in failure(kopt("pack", "--carry", "nope"))[1]


def test_lean_copy_holds_what_a_run_reads_and_names_its_commit(ws, tmp_path, monkeypatch):
    monkeypatch.delenv("KOPT_COMMIT", raising=False)
    dest = tmp_path / "lean"
    res = kopt("pack", "--out", dest, "--carry", ".site", "--json")
    assert res.exit_code == 0, (res.output, res.exception)
    d = json.loads(res.stdout)
    held = set(pack.tree_files(dest))
    assert {"solution/tilelang/run_kernel.py", "bench/cases.yaml", "candidates.jsonl", "notes.txt",
            "results/tilelang/tuning.csv", "results/calibration-H200.json", "workflows/campaign-h200.yaml",
            "workflows/pending/change.patch", vcs.COPIED_FROM} <= held  # the campaign and its patches run there;
    # the prompts do not
    assert not [n for n in held if n.startswith(("trajectory/", "knowledge/", "results/tilelang/report",
                                                 "workflows/prompts/"))]
    assert "ITERATIONS.md" not in held and not (dest / ".site").exists()
    assert d["tree_bytes"] == _git_bytes(dest) and d["carried_bytes"] == 4096 and d["total"] <= d["limit"]
    assert subprocess.run(["git", "status", "--porcelain"], cwd=dest, capture_output=True, text=True).stdout == ""
    source = vcs.head_short(ws / "solution" / "tilelang")
    assert source and not source.endswith("-dirty")
    assert vcs.head_short(dest / "solution" / "tilelang") == source               # rows there name the source
    (dest / "solution" / "tilelang" / "run_kernel.py").write_text("# edited on the host\n")
    assert vcs.head_short(dest / "solution" / "tilelang") == source + "-dirty"
    assert "not an empty folder" in failure(kopt("pack", "--out", dest))[1]
    assert "inside the repository" in failure(kopt("pack", "--out", ws / "inside"))[1]


def test_pack_text_says_whether_it_fits(ws):
    res = kopt("pack", "--carry", ".site", "--limit-mib", "64")
    assert res.exit_code == 0, (res.output, res.exception)
    assert ".site (carried)" in res.stdout and "fits," in res.stdout and "a lean copy" in res.stdout
    res = kopt("pack", "--limit-mib", "0.01")
    assert res.exit_code == 1 and "does NOT fit" in res.stdout
