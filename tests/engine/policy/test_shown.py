"""The shown-candidate rule (kopt.policy.shown): the shipped candidate with its latest verdict and bench rows
for the cases the verdict did not time; the rule's best beside it, with the reason, only when another."""

from __future__ import annotations

import json
import uuid

import pytest

from kopt.paths import ledger_file
from kopt.policy.shown import ranges, shown_candidate
from kopt.records import CaseResult, TimingStats
from kopt.store import ledger
from kopt.store.vcs import candidate_hash

PERF = range(4, 15)
VARIANT = "fp16-d128-contig-full"


def _timing(noisy: bool = False) -> TimingStats:
    return TimingStats(method="cupti", median_ms=0.01, q1_ms=0.009, q3_ms=0.0125 if noisy else 0.0101, min_ms=0.009,
                       n=200, rel_iqr=0.25 if noisy else 0.01, noisy=noisy)


def row(cid: str, case: int, speedup: float, mode: str = "verdict", run: str = "r", device: str = "H200",
        noisy_ref: bool = False, **kw) -> CaseResult:
    return CaseResult(row_id=uuid.uuid4().hex, run_id=run, mode=mode, candidate_id=cid, candidate_hash=cid * 5,
                      case=case, variant=VARIANT, backend="tilelang", compiled=True, correct=True, status="ok",
                      runtime_ms=0.01, ref_runtime_ms=0.01 * speedup, speedup=speedup,
                      speedup_ci=(speedup * 0.99, speedup * 1.01), gbps=1000.0, pct_peak=25.0, device=device,
                      ref="flash_attn-2.8.3", timing=_timing(), ref_timing=_timing(noisy_ref), commit="abc1234", **kw)


@pytest.fixture
def shipped(workspace) -> str:
    """A shipped solution in the workspace; returns its candidate id."""
    p = workspace / "solution" / "tilelang" / "run_kernel.py"
    p.parent.mkdir(parents=True)
    p.write_text("BACKEND = 'tilelang'\ndef run(q, k_cache, v_cache, cache_seqlens):\n    return q\n")
    return candidate_hash(p)[1]


def noisy_older_ledger(ws, cid: str) -> None:
    """An older candidate whose verdict looks better only through case 5, where the baseline was noisy;
    then the shipped one's verdict, its bench rows for the edge cases, one later bench, one CPU bench."""
    old = "0ld0ld0ld0ld"
    ledger.append(ledger_file(ws), [row(old, c, 3.0 if c == 5 else 1.50, run="v-old", noisy_ref=c == 5)
                                    for c in PERF])
    ledger.append(ledger_file(ws), [row(cid, c, 1.40, mode="signal", run="b-early") for c in (4, 11)])
    ledger.append(ledger_file(ws), [row(cid, c, 1.52, run="v-new") for c in PERF])
    # Correctness-only variant rows of the same verdict: never a case's timed row.
    ledger.append(ledger_file(ws), [CaseResult(row_id=uuid.uuid4().hex, run_id="v-new", mode="verdict",
                                               candidate_id=cid, case=c, variant="bf16-d128-paged64-full-matrix",
                                               compiled=True, correct=True, device="H200") for c in (3, 6)])
    ledger.append(ledger_file(ws), [row(cid, c, 1.9, mode="signal", run="b-edge") for c in (1, 2, 3)])
    ledger.append(ledger_file(ws), [row(cid, 10, 1.7, mode="signal", run="b-late")])
    ledger.append(ledger_file(ws), [row(cid, 15, 0.9, mode="signal", run="b-cpu", device="cpu")])


def test_shipped_is_shown_and_the_noisy_older_best_beside_it(workspace, shipped):
    noisy_older_ledger(workspace, shipped)
    s = shown_candidate(workspace)
    assert s.candidate_id == shipped and s.source == "shipped" and s.device == "H200"
    assert s.verdict_run == "v-new" and s.verdict_timed == 11 and s.verdict_rows == 13
    assert s.verdict_geomean == pytest.approx(1.52)
    basis = {c.case: c.basis for c in s.cases}
    assert [c.case for c in s.cases] == list(range(1, 22))
    assert s.by_basis("bench") == [1, 2, 3] and s.by_basis("verdict") == list(PERF)
    assert s.by_basis(None) == [15, 16, 17, 18, 19, 20, 21]  # the CPU bench of case 15 is another device's
    assert basis[4] == "verdict"                         # the verdict beats an earlier bench row
    views = {c.case: c for c in s.cases}
    assert views[1].row["run_id"] == "b-edge" and "the verdict times perf cases only" in views[1].note
    assert "later bench" in views[10].note and "1.700x" in views[10].note and "b-late" in views[10].note
    assert views[15].note.startswith("not measured")
    b = s.best_by_rule
    assert b is not None and b.candidate_id == "0ld0ld0ld0ld" and b.iteration == 1 and b.cases == [5]
    assert "case 5 3.000x vs 1.520x" in b.reason and "its baseline timing noisy, rel IQR 25.0%" in b.reason
    assert "every case it leads on rests on a noisy timing" in b.reason
    assert s.commits == ["abc1234"]
    assert "shipped candidate" in s.summary() and "cases 15-21 not measured" in s.summary()
    assert s.verdict_timing == "eager spans" and "verdict v-new (eager spans)" in s.summary()
    json.dumps(s.brief())                                # JSON-ready, without the raw rows
    assert "row" not in s.brief()["cases"][0]


def test_no_best_beside_when_the_shipped_is_the_best(workspace, shipped):
    ledger.append(ledger_file(workspace), [row("0ld0ld0ld0ld", c, 1.2, run="v-old") for c in PERF])
    ledger.append(ledger_file(workspace), [row(shipped, c, 1.5, run="v-new") for c in PERF])
    s = shown_candidate(workspace)
    assert s.candidate_id == shipped and s.best_by_rule is None


def test_the_shown_verdict_says_how_it_was_timed(workspace, shipped):
    t = _timing().model_copy(update={"device_only": True, "replay": "graph"})
    ledger.append(ledger_file(workspace), [row(shipped, c, 1.5, run="v-graph").model_copy(update={"timing": t})
                                           for c in PERF])
    s = shown_candidate(workspace)
    assert s.verdict_timing == "device-only with graph replays"
    assert "verdict v-graph (device-only with graph replays) 1.500x" in s.summary()


def test_a_stopped_verify_is_named_and_not_shown_as_the_verdict(workspace, shipped):
    n = len(PERF) + 4  # the run was to write four more rows (matrix, hidden) than it did
    ledger.append(ledger_file(workspace), [row(shipped, c, 1.5, run="v-done", verdict_rows=len(PERF)) for c in PERF])
    ledger.append(ledger_file(workspace), [row(shipped, c, 9.0, run="v-cut", verdict_rows=n) for c in PERF])
    s = shown_candidate(workspace)
    assert s.verdict_run == "v-done" and s.verdict_geomean == pytest.approx(1.5)
    assert s.verdict_stopped == f"run v-cut: {len(PERF)} of {n} rows"
    assert "a later verify stopped before its end (run v-cut: 11 of 15 rows): not a verdict" in s.summary()


def test_shipped_without_rows_is_still_shown(workspace, shipped):
    ledger.append(ledger_file(workspace), [row("0ld0ld0ld0ld", c, 1.2, run="v-old") for c in PERF])
    s = shown_candidate(workspace)
    assert s.candidate_id == shipped and s.verdict_run is None and s.by_basis(None) == list(range(1, 22))
    assert s.best_by_rule.candidate_id == "0ld0ld0ld0ld" and "no verdict geomean" in s.best_by_rule.reason


def test_without_a_solution_the_top_ranked_is_shown(workspace):
    ledger.append(ledger_file(workspace), [row("aaaaaaaaaaaa", c, 1.2, run="a") for c in PERF])
    ledger.append(ledger_file(workspace), [row("bbbbbbbbbbbb", c, 1.1, run="b") for c in PERF])
    s = shown_candidate(workspace)
    assert s.candidate_id == "aaaaaaaaaaaa" and s.source == "ledger best" and s.best_by_rule is None


def test_no_improvement_on_the_shown_device_names_the_rules_best_elsewhere(workspace, shipped):
    """The shipped candidate's rows are all from an H100; the only improving iteration ran on an H200. The headline
    does not say no iteration improved: it says none did on the H100 and names the rule's best on the H200."""
    ledger.append(ledger_file(workspace), [row("0ld0ld0ld0ld", c, 1.2, run="v-old") for c in PERF])
    ledger.append(ledger_file(workspace), [row(shipped, c, 1.3, mode="signal", run="b-h100", device="H100")
                                           for c in (4, 5)])
    s = shown_candidate(workspace)
    assert s.device == "H100" and s.rule_best is None
    assert s.rule_best_elsewhere == "0ld0ld0ld0ld (iteration 1, on H200)"
    h = s.headline()
    assert "no iteration improved yet" not in h
    assert "no iteration improved on H100, so no best by the rule there (on another device: 0ld0ld0ld0ld " \
           "(iteration 1, on H200))" in h, h


def test_device_filter(workspace, shipped):
    noisy_older_ledger(workspace, shipped)
    s = shown_candidate(workspace, device="cpu")
    assert s.device == "cpu" and s.verdict_run is None and s.by_basis("bench") == [15]


def test_status_and_candidates_name_the_shown_candidate(workspace, shipped):
    from conftest import kopt

    noisy_older_ledger(workspace, shipped)
    st = json.loads(kopt("status", "--json", "--no-record").stdout)
    assert st["shown"]["candidate_id"] == shipped and st["shown"]["best_by_rule"]["cases"] == [5]
    text = kopt("candidates").stdout
    assert f"shown: shipped candidate {shipped}" in text and "best by the improvement rule: 0ld0ld0ld0ld" in text
    assert json.loads(kopt("candidates", "--json").stdout)["shown"]["candidate_id"] == shipped


def test_ranges():
    assert ranges([5, 1, 2, 3, 7, 8]) == "1-3, 5, 7-8" and ranges([]) == ""
