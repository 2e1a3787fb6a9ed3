"""`kopt commit` / `kopt revert` on real git repositories: staging scope, snapshots, refusals."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import failure, kopt
from kopt.cli.main import app, main
from kopt.records import CaseResult
from kopt.store import ledger, trajectory, vcs

pytestmark = pytest.mark.usefixtures("git_env")  # real git, isolated (conftest)


@pytest.fixture
def ws(request, tmp_path, monkeypatch) -> Path:
    """A fresh `kopt init` workspace; KOPT_WORKSPACE points at it. Commits there draw no figure (conftest.no_figures)
    except in the tests that check them (marked `figures`)."""
    if not request.node.get_closest_marker("figures"):
        request.getfixturevalue("no_figures")
    root = tmp_path / "w"
    res = CliRunner().invoke(app, ["init", str(root)])
    assert res.exit_code == 0, res.stdout
    monkeypatch.setenv("KOPT_WORKSPACE", str(root))
    return root




def test_console_entry_point_exit_code(tmp_path, monkeypatch, capsys):
    """The installed `kopt` (kopt.cli.main.main) exits 2 with one stderr line on a refusal."""
    monkeypatch.setenv("KOPT_WORKSPACE", str(tmp_path / "ws"))
    monkeypatch.setattr(sys, "argv", ["kopt", "commit", "-m", "x"])
    with pytest.raises(SystemExit) as e:
        main()
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "not a git repository" in err


def edit(ws: Path, text: str = "# change\n") -> None:
    p = ws / "solution" / "tilelang" / "run_kernel.py"
    p.write_text(p.read_text() + text)


def test_commit_stages_only_workspace_paths(ws):
    import git

    repo = git.Repo(ws)
    (ws / "README.md").write_text("unrelated edit\n")           # tracked, outside the workspace paths
    (ws / "notes.txt").write_text("untracked scratch\n")
    (ws / "HINTS.md").write_text("staged by hand\n")
    repo.git.add("HINTS.md")                                     # even a staged unrelated file stays out
    edit(ws)
    (ws / "results" / "profile.txt").write_text("profile summary\n")
    res = kopt("commit", "-m", "first try")
    assert res.exit_code == 0, (res.stdout, res.exception)
    committed = set(repo.git.show("--name-only", "--format=", "HEAD").splitlines())
    assert "solution/tilelang/run_kernel.py" in committed and "results/profile.txt" in committed
    assert not committed & {"README.md", "notes.txt", "HINTS.md"}
    assert any(p.startswith("trajectory/1-") for p in committed)
    assert repo.head.commit.summary == "[iter 1] first try"
    status = repo.git.status("--porcelain")
    assert " M README.md" in status and "?? notes.txt" in status and "M  HINTS.md" in status


def test_snapshot_contents_and_numbering(ws):
    edit(ws)
    table = ws / "results" / "tilelang" / "tuning.csv"
    table.parent.mkdir(parents=True, exist_ok=True)
    table.write_text("device,case,config\nH200,10,{}\n")
    h, cid = vcs.candidate_hash(ws / "solution" / "tilelang" / "run_kernel.py")
    ledger.append(ws / "candidates.jsonl", [CaseResult(
        row_id=uuid.uuid4().hex, mode="verdict", candidate_hash=h, candidate_id=cid, case=c, correct=True,
        compiled=True, runtime_ms=0.05, ref_runtime_ms=0.1) for c in (4, 5)])
    assert kopt("log", "--title", "Split KV", "--hypothesis", "more blocks").exit_code == 0
    assert kopt("commit", "-m", "Split KV: 4 ways!").exit_code == 0
    (snap, meta), = trajectory.snapshots(ws)
    assert snap.name.startswith("1-") and snap.name.endswith("-split-kv-4-ways")
    assert len(snap.name.split("-")[1]) == 15 and snap.name.split("-")[1][8] == "T"       # YYYYmmddTHHMMSS
    assert (meta.iteration, meta.candidate_id, meta.candidate_hash) == (1, cid, h)
    assert meta.geomean == pytest.approx(2.0) and meta.n_cases == 2 and not meta.failed
    rows = {r["row_id"]: r["case"] for r in ledger.load_dicts(ws / "candidates.jsonl").rows}
    assert [rows[i] for i in meta.rows] == [4, 5] and not (snap / "results.json").exists()  # by id: in the ledger
    assert (snap / "iteration.md").read_text().startswith("## Iteration 1 — Split KV")
    assert meta.base is None and set(meta.files) == set(trajectory.workspace_files(ws))    # the first: whole
    assert (snap / "solution" / "tilelang" / "run_kernel.py").read_bytes() == \
        (ws / "solution" / "tilelang" / "run_kernel.py").read_bytes()
    # the tuning table the candidate reads two folders above its own: where the snapshot's copy looks for it
    assert (snap / "results" / "tilelang" / "tuning.csv").read_text() == table.read_text()
    assert (snap / "solution" / "tilelang").resolve().parents[1] / "results" / "tilelang" / "tuning.csv" \
        == (snap / "results" / "tilelang" / "tuning.csv").resolve()
    assert not [p for p in (ws / "trajectory").iterdir() if p.name.startswith(".tmp")]
    edit(ws, "# two\n")
    assert kopt("commit", "-m", "again").exit_code == 0      # a commit without a log entry still counts
    assert vcs.next_iteration(ws) == 3 and [m.iteration for _, m in trajectory.snapshots(ws)] == [1, 2]
    (_, _), (two, meta2) = trajectory.snapshots(ws)
    assert meta2.base == snap.name and not (two / "solution").exists()          # a delta against the first
    assert json.loads((two / "files.json").read_text())["files"]["solution/tilelang/run_kernel.py"]["ops"]
    assert trajectory.files(two) == trajectory.workspace_files(ws)


def test_refuse_not_a_repo(tmp_path, monkeypatch, capsys):
    plain = tmp_path / "plain"
    (plain / "solution").mkdir(parents=True)
    monkeypatch.setenv("KOPT_WORKSPACE", str(plain))
    code, err = failure(kopt("commit", "-m", "x"))
    assert code == 2 and err.count("\n") == 1 and "not a git repository" in err and "kopt init" in err


def test_refuse_nothing_changed(ws, monkeypatch, capsys):
    (ws / "README.md").write_text("only an unrelated change\n")
    code, err = failure(kopt("commit", "-m", "x"))
    assert code == 2 and err.count("\n") == 1 and "nothing changed" in err


def test_refuse_detached_head(ws, monkeypatch, capsys):
    import git

    repo = git.Repo(ws)
    repo.git.checkout("--detach")
    edit(ws)
    code, err = failure(kopt("commit", "-m", "x"))
    assert code == 2 and err.count("\n") == 1 and "detached" in err


def test_refuse_merge_in_progress(ws, monkeypatch, capsys):
    import git

    repo = git.Repo(ws)
    repo.git.checkout("-b", "side")
    (ws / "knowledge" / "README.md").write_text("side\n")
    repo.git.commit("-am", "side")
    repo.git.checkout("main")
    (ws / "knowledge" / "README.md").write_text("main\n")
    repo.git.commit("-am", "main")
    with pytest.raises(git.GitCommandError):
        repo.git.merge("side")                                   # conflict: MERGE_HEAD stays
    assert (Path(repo.git_dir) / "MERGE_HEAD").exists()
    code, err = failure(kopt("commit", "-m", "x"))
    assert code == 2 and err.count("\n") == 1 and "merge is in progress" in err


def test_revert_number_is_a_new_commit(ws):
    import git

    repo = git.Repo(ws)
    edit(ws, "# one\n")
    one = (ws / "solution" / "tilelang" / "run_kernel.py").read_text()
    kopt("commit", "-m", "one")
    edit(ws, "# two\n")
    (ws / "solution" / "tilelang" / "helper.py").write_text("X = 2\n")
    kopt("commit", "-m", "two")
    before = repo.head.commit.hexsha
    res = kopt("revert", "1")
    assert res.exit_code == 0, (res.stdout, res.exception)
    assert (ws / "solution" / "tilelang" / "run_kernel.py").read_text() == one
    assert not (ws / "solution" / "tilelang" / "helper.py").exists()
    assert repo.head.commit.summary == "[revert] solution from iter 1"
    assert repo.head.commit.parents[0].hexsha == before                 # history kept, no reset
    changed = set(repo.git.show("--name-only", "--format=", "HEAD").splitlines())
    views = {p for p in changed if p == "results/STATUS.md" or p.startswith("results/tilelang/")}
    assert changed - views == {"solution/tilelang/run_kernel.py", "solution/tilelang/helper.py"}
    assert "results/STATUS.md" in views, "the views that name the shipped candidate are remade into the commit"
    assert not repo.is_dirty(untracked_files=True)
    assert vcs.next_iteration(ws) == 3


def test_revert_refusals(ws):
    code, err = failure(kopt("revert", "1"))
    assert code == 2 and "no trajectory snapshots" in err
    edit(ws)
    kopt("commit", "-m", "one")
    assert "no trajectory snapshot for iteration 7" in failure(kopt("revert", "7"))[1]
    assert "already matches iteration 1" in failure(kopt("revert", "1"))[1]
    assert "iteration number or 'best'" in failure(kopt("revert", "latest"))[1]
    edit(ws, "# dirty\n")                   # an attempt: recorded as iteration 2, then reverted
    res = kopt("revert", "1")
    assert res.exit_code == 0 and res.stdout.splitlines()[0].startswith("[iter 2] attempt, reverted by kopt revert")
    assert "# dirty" not in (ws / "solution" / "tilelang" / "run_kernel.py").read_text()


def test_slugify():
    assert trajectory.slugify("Split-KV: 4 ways, BLOCK_N=64!") == "split-kv-4-ways-block-n-64"
    assert trajectory.slugify("...") == "iter"
    assert len(trajectory.slugify("x" * 100)) == 40


def test_commit_in_subfolder_workspace(tmp_path, monkeypatch):
    """A workspace below the repository root stages its own paths only."""
    import git

    repo = git.Repo.init(tmp_path / "repo")
    ws = tmp_path / "repo" / "kernels"
    (ws / "solution" / "tilelang").mkdir(parents=True)
    (ws / "solution" / "tilelang" / "run_kernel.py").write_text("BACKEND = 'tilelang'\n")
    (tmp_path / "repo" / "other.txt").write_text("x\n")
    monkeypatch.setenv("KOPT_WORKSPACE", str(ws))
    res = kopt("commit", "-m", "start")
    assert res.exit_code == 0, (res.stdout, res.exception)
    files = repo.git.show("--name-only", "--format=", "HEAD").splitlines()
    assert "kernels/solution/tilelang/run_kernel.py" in files and "other.txt" not in files


def test_failed_commit_leaves_no_snapshot(ws):
    import git

    hook = ws / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\necho 'hook says no' >&2\nexit 1\n")
    hook.chmod(0o755)
    edit(ws)
    res = kopt("commit", "-m", "blocked")
    code, err = failure(res)
    assert code == 2 and "git commit failed: hook says no" in err
    assert trajectory.snapshots(ws) == []
    assert "trajectory/1-" not in git.Repo(ws).git.status("--porcelain", "--untracked-files=all")


@pytest.mark.figures
def test_commit_regenerates_plots_and_report(ws):
    """The committed views match the committed data: kopt commit regenerates them into the same commit."""
    import git

    from kopt.report.plot import png_text

    repo = git.Repo(ws)
    edit(ws)
    cid = vcs.candidate_hash(ws / "solution" / "tilelang" / "run_kernel.py")[1]
    res = kopt("commit", "-m", "first try")
    assert res.exit_code == 0 and "refreshed results/tilelang/plots/speedup.png" in res.stdout, res.stdout
    committed = set(repo.git.show("--name-only", "--format=", "HEAD").splitlines())
    views = {"results/tilelang/report.html"} | {f"results/tilelang/plots/{n}.png"
                                                for n in ("speedup", "roofline", "trajectory")}
    assert views <= committed
    assert f"<meta name='kopt-candidate' content='{cid}'>" in (ws / "results" / "tilelang" / "report.html").read_text()
    assert png_text(ws / "results" / "tilelang" / "plots" / "trajectory.png")["kopt-candidate"] == cid


def test_commit_goes_ahead_when_the_views_fail(ws, monkeypatch):
    from kopt.report import page

    def boom(ws):
        raise RuntimeError("no figures today")

    monkeypatch.setattr(page, "refresh", boom)
    edit(ws)
    res = kopt("commit", "-m", "first try")
    assert res.exit_code == 0 and "plots and report not regenerated: RuntimeError: no figures today" in res.stderr


def test_a_message_with_its_own_prefix_is_not_prefixed_twice(ws):
    """`-m "[iter N] ..."` for the iteration being committed: one prefix in the commit; another N: refused
    (exit 2, nothing committed)."""
    import git

    repo = git.Repo(ws)
    edit(ws)
    code, err = failure(kopt("commit", "-m", "[iter 7] wrong number"))
    assert code == 2 and "[iter 7]" in err and "iteration 1" in err
    assert not any(p.name.startswith("1-") for p in (ws / "trajectory").iterdir())  # no snapshot left behind
    res = kopt("commit", "-m", "[iter 1]  tiles of 192 keys")
    assert res.exit_code == 0, (res.stdout, res.exception)
    assert repo.head.commit.summary == "[iter 1] tiles of 192 keys"


def test_head_short_names_a_dirty_candidate_folder(ws, monkeypatch):
    """head_short: the commit of the candidate's folder; '-dirty' once a tracked file there differs from it (a copied
    tree whose git metadata is older than its files), not for changes elsewhere (the ledger grows with every run);
    $KOPT_COMMIT wins over both."""
    import git

    monkeypatch.delenv("KOPT_COMMIT", raising=False)
    folder = ws / "solution" / "tilelang"
    head = git.Repo(ws).head.commit.hexsha[:12]
    assert vcs.head_short(folder) == head
    (ws / "README.md").write_text("edited outside the candidate's folder\n")
    assert vcs.head_short(folder) == head
    edit(ws)
    assert vcs.head_short(folder) == head + "-dirty"
    copy = ws / "old" / "solution"  # another commit's candidate unpacked into the tree: no tracked file there
    copy.mkdir(parents=True)
    (copy / "run_kernel.py").write_text("BACKEND = 'tilelang'\n")
    assert vcs.head_short(copy) is None
    git.Repo(ws).git.checkout("--", "solution")
    assert vcs.head_short(folder) == head
    (folder / "helper.py").write_text("# untracked, beside the candidate\n")
    assert vcs.head_short(folder) == head + "-dirty"
    monkeypatch.setenv("KOPT_COMMIT", "abc1234")
    assert vcs.head_short(folder) == "abc1234"


def test_commit_stores_the_ledger_lean(ws):
    """kopt commit stores the rows appended since the last one lean (the run's shared fields once) and commits that;
    every row reads back the same."""
    import git

    ledger.append(ws / "candidates.jsonl", [CaseResult(row_id=f"r{c}", run_id="v1", mode="verdict", case=c,
                                                       hypothesis="h" * 200, runtime_ms=0.01 * c) for c in (4, 5, 6)])
    before = ledger.load_dicts(ws / "candidates.jsonl").rows
    assert (ws / "candidates.jsonl").read_text().count("h" * 200) == 3
    edit(ws)
    res = kopt("commit", "-m", "lean")
    assert res.exit_code == 0, (res.stdout, res.exception)
    assert (ws / "candidates.jsonl").read_text().count("h" * 200) == 1
    assert ledger.load_dicts(ws / "candidates.jsonl").rows == before
    assert "candidates.jsonl" in git.Repo(ws).git.show("--name-only", "--format=", "HEAD").splitlines()


def test_a_second_commit_of_one_iteration_number_is_named_not_counted(ws):
    """A commit of other files whose subject starts with `[iter N]` (a hand-made `[iter 1] tests: ...`) would make
    the next iteration N + 2, its entry and commit a number off: `kopt log` and `kopt commit` refuse instead (exit 2,
    one line naming both commits), and nothing is logged or committed."""
    import git

    repo = git.Repo(ws)
    edit(ws)
    assert kopt("commit", "-m", "first").exit_code == 0
    (ws / "notes.txt").write_text("tests of iteration 1\n")
    repo.index.add(["notes.txt"])
    repo.index.commit("[iter 1] tests: by hand")
    journal = (ws / "ITERATIONS.md").read_text()
    head = repo.head.commit.hexsha
    for argv in (["log", "--title", "t", "--hypothesis", "h"], ["commit", "-m", "second"]):
        edit(ws)
        code, err = failure(kopt(*argv))
        assert code == 2 and err.count("\n") == 1, err
        assert "[iter 1]" in err and head[:7] in err and "reword" in err, err
        assert (ws / "ITERATIONS.md").read_text() == journal and repo.head.commit.hexsha == head
    repo.git.commit("--amend", "-m", "iteration 1's tests, by hand")
    res = kopt("log", "--title", "t", "--hypothesis", "h")
    assert res.exit_code == 0, (res.stdout, res.exception)
    assert "## Iteration 2 — t" in (ws / "ITERATIONS.md").read_text()
