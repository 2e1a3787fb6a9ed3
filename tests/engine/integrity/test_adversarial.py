"""Cheating and broken candidates (tests/adversarial/) through kopt.eval.bench.evaluate: each gets its status.

One child process per evaluation (~2 s each on the CPU); the cases are tiny and timing is off
except where a check only runs after timing (the spot and refill checks).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import SHIPPED
from kopt.cases import Case, load_cases
from kopt.eval.bench import BenchOptions, evaluate
from kopt.records import CaseResult, Status, TimingStats

ADV = Path(__file__).resolve().parents[2] / "adversarial"
TINY = Case(id=1, batch=2, seqlen_k=9, kv_heads=2, gqa=2, kind="edge")
S = Status

#: candidate -> (accepted statuses, needs timing). Timing is needed where the check runs after it.
EXPECTED = {
    "syntax_error": ({S.compile_error}, False),
    "no_run": ({S.compile_error}, False),
    "raises": ({S.runtime_error}, False),
    "segfault": ({S.crash}, False),
    "abort": ({S.crash}, False),
    "os_exit": ({S.crash}, False),
    "oom": ({S.oom}, False),
    "zeros": ({S.incorrect_numerical}, False),
    "wrong_shape": ({S.incorrect_shape}, False),
    "wrong_dtype": ({S.incorrect_dtype}, False),
    "nan_out": ({S.nan_inf}, False),
    "alias_q": ({S.stale_output}, False),
    "mutate_kcache": ({S.mutated_input}, False),
    "first_output": ({S.stale_output}, False),
    "pointer_cache": ({S.stale_output}, True),
    "half_unwritten": ({S.nan_inf, S.incorrect_numerical}, True),
    "late_thread": ({S.side_stream}, False),
    "native_thread": ({S.side_stream, S.incorrect_numerical}, False),
    "restoring_clock": ({S.tampered}, True),
    "patch_timer": ({S.static_violation}, False),
    "patch_sync_evasive": ({S.tampered}, False),
    "torch_softmax": ({S.static_violation}, False),
    "flash_attn_call": ({S.static_violation}, False),
    "read_ledger": ({S.static_violation}, False),
    # Closing the child's stdout/stderr cannot hide anything: results travel through result.json.
    "close_stdout": ({S.ok}, False),
}


def _eval(name: str, case: Case = TINY, timing: bool = False, timeout_s: float = 120.0, **kw) -> CaseResult:
    opts = BenchOptions(device="cpu", quick=True, record=False, timeout_s=timeout_s, timing=timing, **kw)
    return evaluate(ADV / f"{name}.py", [case], opts)[0]


def test_suite_is_complete():
    files = {p.stem for p in ADV.glob("*.py") if not p.stem.startswith("_")}
    others = {"honest", "infinite_loop", "shape_table", "side_stream_gpu", "side_stream_shipped", "side_stream_joined",
              "overfit_named"}
    assert files == set(EXPECTED) | others
    assert len(files) - 1 >= 15


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_adversarial_status(name):
    statuses, timing = EXPECTED[name]
    r = _eval(name, timing=timing)
    assert r.status in statuses, f"{name}: {r.status.value}: {r.message}"
    assert r.correct == (r.status == S.ok)
    if r.status in (S.compile_error, S.static_violation):
        assert not r.compiled
    if r.status == S.ok:
        assert r.compiled


def test_infinite_loop_times_out():
    r = _eval("infinite_loop", timeout_s=8.0)
    assert r.status == S.timeout and not r.correct
    assert r.overhead_s["child_wall"] < 30


def test_honest_torch_candidate_passes_with_timing():
    r = _eval("honest", timing=True)
    assert r.status == S.ok and r.correct and r.runtime_ms and r.backend == "torch"
    assert r.validation and r.validation.trials >= 4  # correct + 2 spot + refill: no false positive


def test_shape_special_casing_caught_by_hidden_variant():
    case1 = load_cases()[0]  # a table shape: the cheat is correct here
    assert _eval("shape_table", case=case1, hidden=False).status == S.ok
    r = _eval("shape_table", case=case1, hidden=True)
    assert r.status == S.incorrect_numerical and not r.correct
    assert "hidden variant" in r.message
    assert _eval("honest", case=case1, hidden=True).status == S.ok


def test_verdict_hidden_cases_catch_shape_special_casing():
    import random

    from kopt.eval.verdict import hidden_cases

    (h,) = hidden_cases([load_cases()[0]], 1, random.Random(0))
    assert _eval("shape_table", case=h).status == S.incorrect_numerical


def test_shipped_kernel_no_false_positive():
    if not SHIPPED.exists():
        pytest.skip("shipped kernel not present")
    opts = BenchOptions(device="cpu", quick=True, record=False, timeout_s=300, hidden=True)
    r = evaluate(SHIPPED, [TINY], opts)[0]
    assert r.status == S.ok and r.correct, r.message
    assert r.backend == "tilelang"


@pytest.mark.gpu
def test_side_stream_gpu():
    opts = BenchOptions(device="cuda", quick=True, record=False, timeout_s=120, timing=False)
    r = evaluate(ADV / "side_stream_gpu.py", [TINY], opts)[0]
    assert r.status == S.side_stream, r.message


@pytest.mark.gpu
@pytest.mark.parametrize("name, status", [("side_stream_shipped", S.side_stream), ("side_stream_joined", S.ok)])
def test_side_stream_seen_in_device_records(name, status):
    """The shipped kernel on a side stream: rejected unless the caller's stream is made to wait for it."""
    case = load_cases()[9]  # case 10: a split plan, two kernels per call
    opts = BenchOptions(device="cuda", quick=True, record=False, timeout_s=300)
    r = evaluate(ADV / f"{name}.py", [case], opts)[0]
    assert r.status == status, r.message
    if status == S.ok:
        assert r.timing.side_stream == 0 and r.timing.device_only


@pytest.mark.gpu
def test_shipped_kernel_is_not_side_stream():
    opts = BenchOptions(device="cuda", quick=True, record=False, timeout_s=300)
    r = evaluate(SHIPPED, [load_cases()[9]], opts)[0]
    assert r.status == S.ok and r.timing.side_stream == 0 and r.timing.device_only, r.message
    assert r.eager_ms is not None and r.pct_limit is not None
    # The shipped kernel and FA2 both capture: each timed call is a graph replay of its own kernels.
    assert r.timing.replay == r.ref_timing.replay == "graph", r.timing.replay_note


@pytest.mark.gpu
def test_oom_gpu():
    opts = BenchOptions(device="cuda", quick=True, record=False, timeout_s=120, timing=False)
    assert evaluate(ADV / "oom.py", [TINY], opts)[0].status == S.oom


# ---- implausibility: a "too fast" result cannot be produced on the CPU, so test the rule itself ----

def _timed_row(runtime_ms: float, cold: bool = True) -> CaseResult:
    t = TimingStats(method="cupti", median_ms=runtime_ms, q1_ms=runtime_ms, q3_ms=runtime_ms, min_ms=runtime_ms,
                    n=100, rel_iqr=0.0, cold=cold)
    return CaseResult(row_id="x" * 16, compiled=True, status=S.ok, runtime_ms=runtime_ms, timing=t,
                      speedup=1.0, speedup_ci=(0.99, 1.01))


@pytest.fixture
def fake_ceiling(monkeypatch):
    from kopt import roofline
    from kopt.store import calibration

    roof = roofline.Roofline(read_gbps=1000.0, copy_gbps=900.0, floor_ms=0.002)
    monkeypatch.setattr(roofline, "for_device", lambda *a, **k: roof)
    monkeypatch.setattr(calibration, "aa_spread", lambda *a, **k: None)


def test_implausible_when_faster_than_the_read_ceiling(fake_ceiling):
    from kopt.eval import bench
    from kopt.workload import bytes_moved

    case = load_cases()[8]
    at_ceiling_ms = bytes_moved(case) / 1000e9 * 1e3
    r = _timed_row(at_ceiling_ms / 2)  # 2000 GB/s against a 1000 GB/s ceiling
    bench._derive(r, case, "cuda")
    assert r.status == S.implausible and not r.correct and "read ceiling" in r.message

    ok = _timed_row(at_ceiling_ms * 1.1)
    bench._derive(ok, case, "cuda")
    assert ok.status == S.ok and ok.correct and 80 < ok.pct_peak < 100
    assert ok.limit_ms == pytest.approx(at_ceiling_ms) and ok.pct_limit == pytest.approx(100 / 1.1)

    warm = _timed_row(at_ceiling_ms / 2, cold=False)  # hot-L2 numbers may exceed DRAM bandwidth
    bench._derive(warm, case, "cuda")
    assert warm.status == S.ok


def test_poisoned_empty_fills_new_float_buffers_and_restores():
    """Unwritten output is NaN whatever block the allocator reuses; torch is untouched afterwards."""
    import torch

    from kopt.integrity import guards

    before = (torch.empty, torch.empty_like, torch.Tensor.new_empty)
    stale = torch.ones(64)  # a block holding a plausible answer
    del stale
    with guards.poisoned_empty():
        a, b, c = torch.empty(64), torch.empty_like(torch.zeros(3, 5)), torch.zeros(2).new_empty((7,))
        ints = torch.empty(4, dtype=torch.int32)
    assert all(bool(t.isnan().all()) for t in (a, b, c)) and ints.dtype == torch.int32
    assert (torch.empty, torch.empty_like, torch.Tensor.new_empty) == before
