"""The two-geomean improvement rule: uniform and ragged cases judged apart, the uniform rule alone (said so)
when a verdict has no ragged geomean; the ledger's geomeans split by case kind."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest

from kopt.policy import iterations, ranking
from kopt.records import CaseResult
from kopt.store import ledger

THR = 0.01


@pytest.mark.parametrize("uni, rag, outcome, words", [
    (1.05, 0.90, "not improved", "ragged geomean loses"),        # uniform up, ragged lost beyond the noise
    (1.05, 1.05, "improved", "both gain"),
    (1.05, 0.995, "improved", "uniform gains"),                  # ragged within the noise band
    (1.00, 1.05, "improved", "ragged gains"),                    # the reverse: ragged up, uniform kept
    (0.95, 1.10, "not improved", "uniform geomean loses"),
    (1.005, 1.005, "not improved", "neither gains"),
])
def test_both_geomeans_decide(uni, rag, outcome, words):
    j = iterations.judge(1.5 * uni, 1.2 * rag, False, 1.5, 1.2, THR)
    assert j.outcome == outcome and words in j.reason, j.reason
    assert f"uniform {(uni - 1) * 100:+.1f}%" in j.reason and f"ragged {(rag - 1) * 100:+.1f}%" in j.reason


@pytest.mark.parametrize("rag, best_rag, words", [
    (1.0, None, "the previous best has no ragged geomean (older rows)"),
    (None, 1.0, "this verdict has no ragged geomean"),
    (None, None, "neither verdict has a ragged geomean"),
])
def test_without_a_ragged_geomean_the_uniform_rule_decides_and_says_so(rag, best_rag, words):
    up = iterations.judge(1.52, rag, False, 1.5, best_rag, THR)
    flat = iterations.judge(1.505, rag, False, 1.5, best_rag, THR)
    assert (up.outcome, flat.outcome) == ("improved", "not improved")
    assert words in up.reason and "judged by the uniform geomean alone" in up.reason


def test_first_and_failed_verdicts():
    assert iterations.judge(1.0, 1.0, False, None, None, THR).outcome == "improved"
    assert iterations.judge(2.0, 2.0, True, 1.0, 1.0, THR).outcome == "failed"
    assert iterations.judge(None, 2.0, False, 1.0, 1.0, THR).outcome == "failed"
    assert iterations.outcome(1.02, False, 1.0, THR) == "improved"  # the uniform rule, as before


def _row(cid: str, case: int, kind: str, speedup: float, **kw) -> dict:
    return CaseResult(row_id=uuid.uuid4().hex, mode="verdict", candidate_id=cid, case=case, case_kind=kind,
                      compiled=True, correct=True, speedup=speedup, runtime_ms=0.1 / speedup, ref_runtime_ms=0.1,
                      device="H200", **kw).model_dump(mode="json")


def test_ledger_geomeans_keep_ragged_rows_apart():
    rows = [_row("a", 4, "perf", 2.0, pct_limit=50.0), _row("a", 5, "perf", 0.5, pct_limit=50.0),
            _row("a", 15, "ragged", 1.2, pct_limit=30.0), _row("a", 6, None, 1.0)]  # None: an older row, uniform
    g = ranking.geomeans(rows)
    assert (g.uniform, g.n_uniform, g.ragged, g.n_ragged) == (pytest.approx(1.0), 3, pytest.approx(1.2), 1)
    assert (g.pct_limit, g.pct_limit_ragged) == (pytest.approx(50.0), pytest.approx(30.0))
    assert ranking.geomean_of(rows) == (pytest.approx(1.0), 3)


def test_rank_shows_the_ragged_geomean_and_pct_limit(tmp_path):
    path = tmp_path / "candidates.jsonl"
    ledger.append(path, [CaseResult.model_validate(r) for r in (
        _row("a", 4, "perf", 2.0, pct_limit=40.0), _row("a", 15, "ragged", 1.5, pct_limit=20.0),
        _row("b", 4, "perf", 1.0))])
    df, _ = ranking.load_frame(path)
    top = ranking.rank(df).set_index("candidate_id")
    assert top.loc["a", "geomean"] == pytest.approx(2.0) and top.loc["a", "n_cases"] == 1
    assert top.loc["a", "geomean_ragged"] == pytest.approx(1.5) and top.loc["a", "n_ragged"] == 1
    assert top.loc["a", "pct_limit"] == pytest.approx(40.0) and top.loc["a", "pct_limit_ragged"] == pytest.approx(20.0)
    assert top.loc["b", "n_ragged"] == 0 and ranking.best_per_case(df)["pct_limit"].iloc[0] == pytest.approx(40.0)


@pytest.mark.usefixtures("git_env", "no_figures")
def test_status_judges_iterations_by_both_geomeans(tmp_path, monkeypatch):
    """Iteration 2 gains on the uniform cases but loses the ragged ones: not improved, and status says why;
    iteration 3 gains on both; a re-verified candidate is judged by its latest verdict."""
    from conftest import kopt as run
    from kopt.store.vcs import candidate_hash

    ws = tmp_path / "w"
    assert run("init", ws).exit_code == 0
    monkeypatch.setenv("KOPT_WORKSPACE", str(ws))
    sol = ws / "solution" / "tilelang" / "run_kernel.py"

    def verdict(uni: float, rag: float) -> str:
        h, cid = candidate_hash(sol)
        run_id = uuid.uuid4().hex[:12]
        rows = [CaseResult(row_id=uuid.uuid4().hex, run_id=run_id, mode="verdict", candidate_hash=h, candidate_id=cid,
                           case=c, case_kind=kind, compiled=True, correct=True, speedup=s, runtime_ms=0.1 / s,
                           ref_runtime_ms=0.1, pct_limit=40.0, device="H200")
                for c, kind, s in ((4, "perf", uni), (5, "perf", uni), (15, "ragged", rag))]
        ledger.append(ws / "candidates.jsonl", rows)
        return cid

    for k, (uni, rag) in enumerate([(1.5, 1.2), (1.6, 1.0), (1.6, 1.3)], 1):
        sol.write_text(sol.read_text() + f"\n# variant {k}\n")
        verdict(uni, rag)
        assert run("log", "--hypothesis", f"h{k}").exit_code == 0
        assert run("commit", "-m", f"try {k}").exit_code == 0
    rep = json.loads(run("status", "--json", "--no-record").stdout)
    assert [it["outcome"] for it in rep["recent"]] == ["improved", "not improved", "improved"]
    assert "ragged geomean loses" in rep["recent"][1]["reason"]
    assert rep["best"]["iteration"] == 3 and rep["best"]["geomean_ragged"] == pytest.approx(1.3)
    assert "iteration 3" in rep["why_best"] and "ragged 1.300x" in rep["why_best"]
    bench = (ws / "ITERATIONS.md").read_text()
    assert "ragged geomean loses" in bench and "| 15 ragged |" in bench and "% limit" in bench
    text = run("status", "--no-record").stdout
    first = text.splitlines()[0]  # the headline: the shipped candidate is the rule's best here
    assert first.startswith("shipped ") and "also the best by the improvement rule" in first

    verdict(1.6, 1.45)  # iteration 3's candidate re-verified: its latest verdict is the one judged
    assert iterations.history(ws)[-1].geomean_ragged == pytest.approx(1.45)


def test_device_only_verdicts_are_judged_among_themselves():
    from kopt.policy.iterations import timing_generation

    eager = [{"timing": {"device_only": False}}, {"timing": None}]
    dev_only = [{"timing": {"device_only": True}}, {"timing": {"device_only": True}}, {"timing": None}]
    assert timing_generation(eager) == "eager"
    assert timing_generation(dev_only) == "device-only"
    assert timing_generation([{"timing": {"device_only": True}}, {"timing": {"device_only": False}}]) == "eager"
    assert timing_generation([]) == "eager"
    graph = [{"timing": {"device_only": True, "replay": "graph"}},
             {"timing": {"device_only": True, "replay": "stream"}}]
    assert timing_generation(graph) == "graph"          # the replaying harness, whichever way each call ran
    assert timing_generation(graph + dev_only) == "device-only"


@pytest.mark.usefixtures("git_env", "no_figures")
def test_log_does_not_judge_a_graph_verdict_against_a_stream_best(tmp_path, monkeypatch):
    """ITERATIONS.md's Bench line compares only verdicts of one timing generation: the first verdict timed with
    graph replays is a new baseline there, as in the history, even when an older best reads higher."""
    from conftest import kopt as run
    from kopt.records import TimingStats
    from kopt.store.vcs import candidate_hash
    from kopt.workspace import log

    ws = tmp_path / "w"
    assert run("init", ws).exit_code == 0
    monkeypatch.setenv("KOPT_WORKSPACE", str(ws))
    sol = ws / "solution" / "tilelang" / "run_kernel.py"

    def verdict(uni: float, replay) -> None:
        h, cid = candidate_hash(sol)
        run_id = uuid.uuid4().hex[:12]
        t = TimingStats(method="cupti", median_ms=0.1, q1_ms=0.1, q3_ms=0.1, min_ms=0.1, n=100, rel_iqr=0.0,
                        device_only=True, replay=replay)
        ledger.append(ws / "candidates.jsonl", [
            CaseResult(row_id=uuid.uuid4().hex, run_id=run_id, mode="verdict", candidate_hash=h, candidate_id=cid,
                       case=c, case_kind="perf", compiled=True, correct=True, speedup=uni, runtime_ms=0.1 / uni,
                       ref_runtime_ms=0.1, device="H200", timing=t) for c in (4, 5)])

    verdict(1.5, None)                      # device-only on the stream
    assert run("log", "--hypothesis", "stream").exit_code == 0 and run("commit", "-m", "one").exit_code == 0
    sol.write_text(sol.read_text() + "\n# variant 2\n")
    verdict(1.4, "graph")                   # lower, but timed another way
    bench = log.bench_section(ws)
    assert "a new baseline" in bench and "iter 1 at 1.500x" in bench and "not improved" not in bench, bench
    assert run("log", "--hypothesis", "graph").exit_code == 0 and run("commit", "-m", "two").exit_code == 0
    last = iterations.history(ws)[-1]
    assert last.outcome == "improved" and last.generation == "graph" and "graph replays" in last.reason


def test_a_stopped_verify_run_is_no_verdict():
    """Rows of a `kopt verify` run carry how many the run writes: a run stopped after its perf cases (killed,
    out of time) is skipped, and the candidate's latest finished run is its verdict; rows older than the count
    are taken as they are."""
    done = [_row("a", c, "perf", 1.5, run_id="r1", verdict_rows=3) for c in (4, 5, 6)]
    stopped = [_row("a", c, "perf", 9.0, run_id="r2", verdict_rows=3) for c in (4, 5)]
    assert [r["speedup"] for r in ranking.latest_verdict(done + stopped, "a")] == [1.5, 1.5, 1.5]
    assert ranking.latest_verdict(stopped, "a") == []
    old = [_row("a", c, "perf", 1.2, run_id="r0") for c in (4, 5)]
    assert [r["speedup"] for r in ranking.latest_verdict(old + stopped, "a")] == [1.2, 1.2]


def test_a_stopped_verify_run_is_not_ranked_as_a_verdict(tmp_path):
    path = tmp_path / "candidates.jsonl"
    stopped = [_row("b", c, "perf", 9.0, run_id="r2", verdict_rows=3) for c in (4, 5)]
    signal = [dict(_row("b", c, "perf", 1.1, run_id="s1"), mode="signal") for c in (4, 5)]
    ledger.append(path, [CaseResult.model_validate(r) for r in signal + stopped +
                         [_row("a", 4, "perf", 2.0, run_id="r1", verdict_rows=1)]])
    top = ranking.rank(ranking.load_frame(path)[0]).set_index("candidate_id")
    assert top.loc["b", "basis"] == "signal" and top.loc["b", "geomean"] == pytest.approx(1.1)
    assert top.loc["a", "basis"] == "verdict"


@pytest.mark.usefixtures("git_env", "no_figures")
def test_a_pair_timed_together_is_compared_with_each_other(tmp_path, monkeypatch):
    """Iteration 2's candidate was verified beside iteration 1's (one campaign call, two minutes apart), on a host
    that reads both slower; iteration 1's candidate was re-verified alone later, on a faster one. The rule compares
    the pair timed together, not the best's latest verdict, and both the history and ITERATIONS.md's Bench line say
    which run they compared against; with no verdict of the best within PAIR_WINDOW_S, its latest decides."""
    from conftest import kopt as run
    from kopt.store.vcs import candidate_hash
    from kopt.workspace import log

    ws = tmp_path / "w"
    assert run("init", ws).exit_code == 0
    monkeypatch.setenv("KOPT_WORKSPACE", str(ws))
    sol = ws / "solution" / "tilelang" / "run_kernel.py"

    def verdict(uni: float, when: str) -> tuple[str, str]:
        h, cid = candidate_hash(sol)
        run_id = uuid.uuid4().hex[:12]
        ledger.append(ws / "candidates.jsonl", [
            CaseResult(row_id=uuid.uuid4().hex, run_id=run_id, mode="verdict", candidate_hash=h, candidate_id=cid,
                       case=c, case_kind="perf", compiled=True, correct=True, speedup=uni, runtime_ms=0.1 / uni,
                       ref_runtime_ms=0.1, device="H200", timestamp=when) for c in (4, 5)])
        return cid, run_id

    first = sol.read_text()
    verdict(1.55, "2026-12-01T10:00:00+00:00")
    assert run("log", "--hypothesis", "one").exit_code == 0 and run("commit", "-m", "one").exit_code == 0
    sol.write_text(first + "\n# variant 2\n")
    second = sol.read_text()
    sol.write_text(first)
    _, beside = verdict(1.50, "2026-12-02T09:00:00+00:00")      # iteration 1's candidate, beside the new one
    sol.write_text(second)
    verdict(1.55, "2026-12-02T09:02:00+00:00")                  # +3.3% over the pair, -0.6% under the latest below
    sol.write_text(first)
    verdict(1.56, "2026-12-02T15:00:00+00:00")                  # iteration 1's candidate alone, another session
    sol.write_text(second)
    bench = log.bench_section(ws)
    assert "previous best 1.500x" in bench and f"run {beside}, 2 min apart" in bench and "-> improved" in bench, bench
    assert run("log", "--hypothesis", "two").exit_code == 0 and run("commit", "-m", "two").exit_code == 0
    one, two = iterations.history(ws)
    assert one.geomean == pytest.approx(1.56)                   # an iteration's own verdict: its latest
    assert two.outcome == "improved" and two.best_before == pytest.approx(1.50)
    assert f"run {beside}, 2 min apart" in two.reason and "uniform +3.3%" in two.reason

    rows = [r for r in ledger.load_dicts(ws / "candidates.jsonl").rows]
    late = ranking.latest_verdict(rows, two.candidate_id)
    pair = iterations.paired_verdict(rows, one.candidate_id, "H200", "eager", iterations.run_time(late))
    assert pair is not None and pair.run_id == beside and pair.apart_s == pytest.approx(120)
    when = iterations.run_time(late)
    assert iterations.paired_verdict(rows, one.candidate_id, "H200", "eager", when + timedelta(hours=1)) is None
    assert iterations.paired_verdict(rows, one.candidate_id, "H200", "graph", when) is None  # timed another way
    assert iterations.paired_verdict(rows, one.candidate_id, "CPU", "eager", when) is None   # another device
