"""The whole loop through the CLI: init -> verdict -> log -> commit (x4) -> status -> revert best."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kopt.cli.main import app
from kopt.policy import iterations, ranking
from kopt.records import CaseResult
from kopt.store import journal, ledger, trajectory
from kopt.store.vcs import candidate_hash
from kopt.workspace import log

CASES = (1, 2, 3)
#: KOPT_TEST_REAL_VERDICT=1 runs the real `kopt verify` (CPU, quick) instead of writing verdict rows.
REAL = os.environ.get("KOPT_TEST_REAL_VERDICT") == "1"


pytestmark = pytest.mark.usefixtures("git_env", "no_figures")  # real git, isolated; no matplotlib renders (conftest)


def init_workspace(ws: Path, monkeypatch) -> Path:
    """`kopt init ws`, and KOPT_WORKSPACE pointing at it."""
    kopt("init", ws)
    monkeypatch.setenv("KOPT_WORKSPACE", str(ws))
    return ws


def kopt(*args: str, code: int = 0):
    """Run kopt through typer's CliRunner; assert the exit code."""
    res = CliRunner().invoke(app, [str(a) for a in args])
    got = getattr(res.exception, "exit_code", res.exit_code) if res.exception else res.exit_code
    assert got == code, (res.stdout, repr(res.exception))
    return res


def fake_verdict(ws: Path, speedup: float, correct: bool = True, device: str = "cpu") -> str:
    """Verdict rows for the current solution, as `kopt verify` will append them; returns the candidate id."""
    h, cid = candidate_hash(ws / "solution" / "tilelang" / "run_kernel.py")
    rows = [CaseResult(row_id=uuid.uuid4().hex, mode="verdict", candidate_hash=h, candidate_id=cid, case=c,
                       compiled=True, correct=correct or c != 2, status="ok" if correct or c != 2 else
                       "incorrect_numerical", runtime_ms=0.1 / speedup, ref_runtime_ms=0.1, speedup=speedup,
                       device=device, backend="tilelang") for c in CASES]
    ledger.append(ws / "candidates.jsonl", rows)
    return cid


def real_verdict(ws: Path, speedup: float, correct: bool = True) -> str:
    """The real `kopt verify` on case 1 (CPU, quick); its numbers cannot be steered: structure checks only."""
    res = CliRunner().invoke(app, ["verify", "--case", "1", "--device", "cpu", "--quick-timing", "--machine"])
    assert res.exit_code in (0, 1), (res.stdout, res.stderr, repr(res.exception))   # 1: the verdict failed
    return candidate_hash(ws / "solution" / "tilelang" / "run_kernel.py")[1]


verdict = real_verdict if REAL else fake_verdict


def edit_solution(ws: Path, k: int) -> None:
    """A new candidate: the starter plus a marker line (a different hash, still a working kernel)."""
    p = ws / "solution" / "tilelang" / "run_kernel.py"
    p.write_text(p.read_text() + f"\n# iteration {k} variant\n")


def iteration(ws: Path, k: int, speedup: float, correct: bool = True) -> str:
    edit_solution(ws, k)
    cid = verdict(ws, speedup, correct)
    kopt("log", "--title", f"try {k}", "--hypothesis", f"hypothesis {k}", "--analysis", f"analysis {k}",
         "--next", f"next {k}")
    kopt("commit", "-m", f"try {k}: tile change")
    return cid


def test_whole_loop(tmp_path, monkeypatch):
    ws = init_workspace(tmp_path / "loop", monkeypatch)

    iteration(ws, 1, 1.20)
    first = (ws / "solution" / "tilelang" / "run_kernel.py").read_text()
    iteration(ws, 2, 1.10)                     # slower
    iteration(ws, 3, 1.19)                     # not better than 1.20
    s3 = json.loads(kopt("status", "--json").stdout)
    if not REAL:
        assert [it["outcome"] for it in s3["recent"]] == ["improved", "not improved", "not improved"]
        assert s3["since_improvement"] == 2 and not s3["stagnating"]
    iteration(ws, 4, 1.50, correct=False)      # fast but wrong on case 2: failed

    import git

    subjects = git.Repo(ws).git.log("--format=%s").splitlines()
    assert [s.split("]")[0] + "]" for s in subjects if s.startswith("[iter")] == [f"[iter {k}]" for k in (4, 3, 2, 1)]
    assert subjects[-1] == "kopt init"
    snaps = sorted(p.name for p in (ws / "trajectory").iterdir() if p.is_dir())
    assert [s.split("-")[0] for s in snaps] == ["1", "2", "3", "4"]
    from kopt.store import trajectory

    # each snapshot rebuilds its iteration's candidate (the first whole, the others as deltas)
    assert all("solution/tilelang/run_kernel.py" in trajectory.files(ws / "trajectory" / s) for s in snaps)
    entries = journal.parse((ws / "ITERATIONS.md").read_text())
    assert [e.number for e in entries] == [1, 2, 3, 4]
    assert list(entries[0].sections) == list(journal.SECTIONS)
    assert "run_kernel.py" in entries[1].sections["Changes"]

    if REAL:
        return
    s4 = json.loads(kopt("status", "--json").stdout)
    assert [it["outcome"] for it in s4["recent"]] == ["improved", "not improved", "not improved", "failed"]
    assert s4["stagnating"] and s4["since_improvement"] == 3 and s4["recorded"]
    assert s4["worst_case"] == 2 and "kopt profile --case 2" in s4["protocol"][0]
    text = kopt("status").stdout
    assert "STAGNATION" in text and "diagnosis_checklist.md" in text
    stag = [r for r in ledger.load_dicts(ws / "candidates.jsonl").rows if r.get("kind") == "stagnation"]
    assert len(stag) == 1, "recorded once per episode"
    assert "improved" in entries[1].sections["Bench"] and "previous best 1.200x" in entries[1].sections["Bench"]

    res = kopt("revert", "best")
    assert "[revert] solution from iter 1" in res.stdout
    assert (ws / "solution" / "tilelang" / "run_kernel.py").read_text() == first
    assert git.Repo(ws).head.commit.summary == "[revert] solution from iter 1"
    assert iterations.history(ws)[-1].iteration == 4, "a revert is not an iteration"


def test_status_empty_workspace(tmp_path, monkeypatch):
    init_workspace(tmp_path / "w", monkeypatch)
    rep = json.loads(kopt("status", "--json").stdout)
    assert rep["iterations"] == 0 and rep["best"] is None and not rep["stagnating"]
    assert "iterations: 0" in kopt("status").stdout


def test_threshold_from_calibration(tmp_path, monkeypatch):
    ws = init_workspace(tmp_path / "w", monkeypatch)
    assert iterations.threshold(ws) == pytest.approx(0.03)         # no calibration: 3 x DEFAULT_SPREAD
    fake_verdict(ws, 1.0)
    (ws / "results" / "calibration-cpu.json").write_text(json.dumps(
        {"device": "cpu", "timestamp": "t", "entries": [], "spread": 0.002}))
    assert iterations.threshold(ws) == pytest.approx(0.01)         # max(1%, 3 x 0.2%)
    (ws / "results" / "calibration-cpu.json").write_text(json.dumps(
        {"device": "cpu", "timestamp": "t", "entries": [], "spread": 0.02}))
    assert iterations.threshold(ws) == pytest.approx(0.06)


def test_late_verdict_and_no_verdict(tmp_path, monkeypatch):
    """An iteration committed before its verdict uses the later verdict; none at all is 'not judged'."""
    ws = init_workspace(tmp_path / "w", monkeypatch)
    edit_solution(ws, 1)
    kopt("log", "--hypothesis", "h")
    kopt("commit", "-m", "no verdict yet")
    assert iterations.history(ws)[0].outcome == "not judged"
    fake_verdict(ws, 1.3)
    it = iterations.history(ws)[0]
    assert (it.outcome, it.geomean) == ("improved", pytest.approx(1.3))


def test_outcomes_compare_iterations_on_one_device(tmp_path, monkeypatch):
    """A GPU verdict is judged against earlier GPU iterations, never against a CPU geomean."""
    ws = init_workspace(tmp_path / "dev", monkeypatch)
    for k, (speedup, device) in enumerate([(0.7, "cpu"), (1.4, "H200"), (1.39, "H200"), (0.75, "cpu")], 1):
        edit_solution(ws, k)
        fake_verdict(ws, speedup, device=device)
        if k == 3:  # the Bench section names the previous best on the same device
            bench = log.bench_section(ws)
            assert "previous best 1.400x (iter 2" in bench and "not improved" in bench, bench
        kopt("log", "--title", f"try {k}", "--hypothesis", f"h {k}", "--analysis", f"a {k}", "--next", f"n {k}")
        kopt("commit", "-m", f"try {k}")
    hist = iterations.history(ws)
    assert [(it.device, it.outcome) for it in hist] == [
        ("cpu", "improved"), ("H200", "improved"), ("H200", "not improved"), ("cpu", "improved")]
    assert hist[1].best_before is None and hist[2].best_before == pytest.approx(1.4)
    assert iterations.best_iteration(hist, "H200").iteration == 2 and iterations.best_iteration(hist,
                                                                                                "cpu").iteration == 4


def test_changes_count_from_the_last_iteration_commit(tmp_path, monkeypatch):
    """A kernel edit committed on its own before measuring (so rows can name its commit) still
    shows in the next entry's Changes: the diff runs from the last [iter N] commit."""
    import git

    from kopt.store import vcs

    ws = init_workspace(tmp_path / "chg", monkeypatch)
    iteration(ws, 1, 1.2)
    edit_solution(ws, 2)
    repo = git.Repo(ws)
    repo.index.add(["solution/tilelang/run_kernel.py"])
    repo.index.commit("kernel edit, committed before the GPU run")
    assert "solution/tilelang/run_kernel.py" in vcs.diff_stat(ws)
    assert "solution/tilelang/run_kernel.py" not in repo.git.diff("--stat", "HEAD")  # what HEAD alone would show


def test_changes_after_a_revert_count_from_it(tmp_path, monkeypatch):
    """After `kopt revert` the next entry's Changes are that iteration's edit only: the reverted kernel's lines, which
    the [revert] commit undid, are not counted again against the last [iter N] commit."""
    from kopt.store import vcs

    ws = init_workspace(tmp_path / "rev", monkeypatch)
    iteration(ws, 1, 1.2)
    p = ws / "solution" / "tilelang" / "run_kernel.py"
    p.write_text(p.read_text() + "".join(f"# iteration 2 line {i}\n" for i in range(40)))
    verdict(ws, 1.1)
    kopt("log", "--title", "try 2", "--hypothesis", "h", "--analysis", "a", "--next", "n")
    kopt("commit", "-m", "try 2")
    kopt("revert", "1")
    assert "solution/tilelang/run_kernel.py" not in vcs.diff_stat(ws)   # the revert is the base now
    edit_solution(ws, 3)
    stat = vcs.diff_stat(ws)
    assert "run_kernel.py | 2 ++" in stat, stat   # this edit's two lines, not the 40 the revert removed


def test_bench_section_names_noisy_timings(tmp_path, monkeypatch):
    """A verdict row whose baseline (or candidate) timing was flagged noisy says so in the Bench table and
    in a line under it: a speedup resting on a noisy timing is not one to bet on."""
    from kopt.records import TimingStats

    ws = init_workspace(tmp_path / "noisy", monkeypatch)
    edit_solution(ws, 1)
    h, cid = candidate_hash(ws / "solution" / "tilelang" / "run_kernel.py")

    def stats(noisy):
        return TimingStats(method="cupti", median_ms=0.01, q1_ms=0.009, q3_ms=0.012 if noisy else 0.0101,
                           min_ms=0.009, n=100, rel_iqr=0.3 if noisy else 0.01, noisy=noisy)

    rows = [CaseResult(row_id=uuid.uuid4().hex, mode="verdict", candidate_hash=h, candidate_id=cid, case=c,
                       compiled=True, correct=True, status="ok", runtime_ms=0.005, ref_runtime_ms=0.01, speedup=2.0,
                       device="H200", backend="tilelang", timing=stats(False), ref_timing=stats(c == 2))
            for c in CASES]
    ledger.append(ws / "candidates.jsonl", rows)
    bench = log.bench_section(ws)
    lines = {ln.split("|")[1].strip(): ln for ln in bench.splitlines() if ln.startswith("| ") and "---" not in ln}
    assert "| ref |" in lines["2"] and "| ref |" not in lines["1"], bench
    assert "Noisy timing" in bench and "case 2 (ref)" in bench
    assert ranking.noisy_sides({"timing": {"noisy": True}, "ref_timing": {"noisy": True}}) == "both"
    assert ranking.noisy_sides({"timing": None}) == ""


def bench_rows(ws: Path, speedup: float, cases=(5, 10), config=None) -> str:
    """Bench (signal) rows of the current solution, as `kopt bench` appends them; returns the candidate id."""
    h, cid = candidate_hash(ws / "solution" / "tilelang" / "run_kernel.py")
    rows = [CaseResult(row_id=uuid.uuid4().hex, mode="signal", candidate_hash=h, candidate_id=cid, case=c,
                       compiled=True, correct=True, status="ok", runtime_ms=4.39 / speedup, ref_runtime_ms=4.39,
                       speedup=speedup, device="cpu", backend="tilelang", config=config) for c in cases]
    ledger.append(ws / "candidates.jsonl", rows)
    return cid


def test_a_bench_only_iteration_logs_its_own_rows_and_is_not_judged(tmp_path, monkeypatch):
    """edit -> bench -> log -> commit: the entry holds this candidate's bench rows (not the previous candidate's
    verdict), says `not judged`, never `improved`; and it does not count toward stagnation."""
    ws = init_workspace(tmp_path / "w", monkeypatch)
    iteration(ws, 1, 1.20)                                   # a verdict: improved
    edit_solution(ws, 2)
    cid = bench_rows(ws, 0.5)                                # 2x slower, bench rows only
    kopt("log", "--title", "slower", "--hypothesis", "h", "--analysis", "a", "--next", "n")
    kopt("commit", "-m", "slower")
    bench = journal.parse((ws / "ITERATIONS.md").read_text())[1].sections["Bench"]
    assert f"`{cid}`" in bench and "| bench |" in bench and "8.7800" in bench   # its own rows: 4.39 / 0.5
    assert "not judged" in bench and "improved" not in bench and "| 1 |" not in bench  # no row of case 1's verdict
    for k in (3, 4, 5):                                      # three more without a verdict: no stagnation
        edit_solution(ws, k)
        bench_rows(ws, 1.0)
        kopt("commit", "-m", f"try {k}")                     # no log: commit writes the entry
    s = json.loads(kopt("status", "--json", "--no-record").stdout)
    assert [it["outcome"] for it in s["recent"]] == ["improved"] + ["not judged"] * 4
    assert s["since_improvement"] == 0 and not s["stagnating"]
    numbers = [e.number for e in journal.parse((ws / "ITERATIONS.md").read_text())]
    assert numbers == [1, 2, 3, 4, 5], "kopt commit without kopt log writes the entry: no number skipped"


def test_an_empty_commit_is_refused_unless_asked_for(tmp_path, monkeypatch):
    ws = init_workspace(tmp_path / "w", monkeypatch)
    iteration(ws, 1, 1.2)
    bench_rows(ws, 1.0)                                      # the ledger changed, the kernel did not
    res = kopt("commit", "-m", "nothing changed", code=2)
    assert "nothing changed for iteration 2" in repr(res.exception) + res.stderr
    import git

    assert sum(s.startswith("[iter") for s in git.Repo(ws).git.log("--format=%s").splitlines()) == 1
    kopt("commit", "-m", "re-measured", "--allow-empty")
    assert [e.number for e in journal.parse((ws / "ITERATIONS.md").read_text())] == [1, 2]


def test_revert_best_from_a_dirty_attempt_records_it_first(tmp_path, monkeypatch):
    ws = init_workspace(tmp_path / "w", monkeypatch)
    iteration(ws, 1, 1.30)
    best = (ws / "solution" / "tilelang" / "run_kernel.py").read_text()
    iteration(ws, 2, 1.10)                                   # not improved
    edit_solution(ws, 3)                                     # an attempt, never committed
    attempt = (ws / "solution" / "tilelang" / "run_kernel.py").read_text()
    out = kopt("revert", "best").stdout
    assert "[iter 3] attempt, reverted by kopt revert" in out and "[revert] solution from iter 1" in out
    assert (ws / "solution" / "tilelang" / "run_kernel.py").read_text() == best
    snap = next(p for p in (ws / "trajectory").iterdir() if p.name.startswith("3-"))
    kept, _ = trajectory.files(snap)["solution/tilelang/run_kernel.py"]   # whole, or as a delta on an earlier one
    assert kept.decode() == attempt, "the attempt is kept"
    assert [it.outcome for it in iterations.history(ws)] == ["improved", "not improved", "not judged"]
    import git

    repo = git.Repo(ws)
    assert not repo.is_dirty(untracked_files=True), "the views, which name the shipped candidate, are in the commit"
    assert "(iteration 1," in (ws / "results" / "STATUS.md").read_text().split("\n\n")[2]


def test_best_per_case_says_which_rows_are_configs_or_screens(tmp_path, monkeypatch):
    ws = init_workspace(tmp_path / "w", monkeypatch)
    edit_solution(ws, 1)
    bench_rows(ws, 1.0, cases=(5,))
    bench_rows(ws, 2.0, cases=(10,), config={"cpu_block_N": 64})
    s = json.loads(kopt("status", "--json", "--no-record").stdout)
    basis = {r["case"]: r["basis"] for r in s["best_per_case"]}
    assert basis == {5: "bench", 10: "bench --config"}
    assert "bench --config" in kopt("status", "--no-record").stdout
