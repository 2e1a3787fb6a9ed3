"""The Verdict's aggregates (uniform and ragged geomeans apart) and its hidden shapes of ragged cases."""

from __future__ import annotations

import random

import pytest

from kopt.cases import hidden_variant, load_file, reshaped
from kopt.eval.verdict import Verdict, hidden_cases, plan
from kopt.records import CaseResult, Status


def row(case: int, kind: str, speedup, pct=None, correct=True) -> CaseResult:
    return CaseResult(row_id=f"r{case}", case=case, case_kind=kind, compiled=True, correct=correct,
                      speedup=speedup, pct_limit=pct)


def fields(line: str) -> dict:
    return dict(tok.split(":", 1) for tok in line.split())


def test_line_keeps_the_old_fields_first_and_adds_the_ragged_and_limit_geomeans():
    v = Verdict([row(4, "perf", 2.0, 50.0), row(5, "perf", 0.5, 80.0), row(15, "ragged", 1.5, 40.0),
                 row(16, "ragged", 1.5, 10.0)], [], [])
    line = v.line()
    keys = [tok.split(":")[0] for tok in line.split()]
    assert keys[:11] == ["VERDICT", "GEOMEAN_SPEEDUP", "MIN_SPEEDUP", "CORRECT", "ROWS_CORRECT", "PERF_CASES",
                         "MATRIX", "HIDDEN", "GEOMEAN_SPEEDUP_RAGGED", "GEOMEAN_PCT_LIMIT", "GEOMEAN_PCT_LIMIT_RAGGED"]
    assert {"GEOMEAN_SPEEDUP_HELDOUT", "GEOMEAN_PCT_LIMIT_HELDOUT", "MIN_SPEEDUP_HELDOUT", "HELDOUT_SEED"} <= set(keys)
    f = fields(line)
    assert f["GEOMEAN_SPEEDUP"] == "1.0000x", "over the uniform cases only"
    assert f["GEOMEAN_SPEEDUP_RAGGED"] == "1.5000x"
    assert f["GEOMEAN_PCT_LIMIT"] == f"{(50 * 80) ** 0.5:.1f}" and f["GEOMEAN_PCT_LIMIT_RAGGED"] == "20.0"
    assert f["MIN_SPEEDUP"] == "0.5000x" and f["PERF_CASES"] == "4"
    assert f["CORRECT"] == "True" and f["ROWS_CORRECT"] == "4/4", "CORRECT is a bool, the count has its own field"


def test_a_failed_row_stopped_run_and_screen_say_so_in_verdict():
    bad = Verdict([row(4, "perf", 2.0), row(5, "perf", 1.0, correct=False)], [], [])
    f = fields(bad.line())
    assert (f["VERDICT"], f["CORRECT"], f["ROWS_CORRECT"]) == ("fail", "False", "1/2")
    stopped = Verdict([row(4, "perf", 2.0)], [], [], planned={"perf": 3, "matrix": 2, "hidden": 0, "heldout": 0})
    f = fields(stopped.line())
    assert f["VERDICT"] == "stopped" and f["NOT_RUN"] == "perf=2,matrix=2" and f["CORRECT"] == "True"
    assert fields(Verdict([row(4, "perf", 2.0)], [], [], screen=True).line())["VERDICT"] == "screen"


@pytest.mark.parametrize("rows, na", [
    ([row(4, "perf", 2.0, 50.0), row(15, "ragged", 1.5, None)], {"GEOMEAN_PCT_LIMIT_RAGGED"}),
    ([row(4, "perf", 2.0, 50.0), row(15, "ragged", 1.5, 9.0, correct=False)],
     {"GEOMEAN_SPEEDUP_RAGGED", "GEOMEAN_PCT_LIMIT_RAGGED"}),
    ([row(4, "perf", 2.0), row(5, "perf", None)], {"GEOMEAN_SPEEDUP", "GEOMEAN_SPEEDUP_RAGGED", "GEOMEAN_PCT_LIMIT",
                                                   "GEOMEAN_PCT_LIMIT_RAGGED"}),
])
def test_a_missing_value_makes_its_geomean_na(rows, na):
    f = fields(Verdict(rows, [], []).line())
    old = ("GEOMEAN_SPEEDUP", "MIN_SPEEDUP", "GEOMEAN_SPEEDUP_RAGGED", "GEOMEAN_PCT_LIMIT", "GEOMEAN_PCT_LIMIT_RAGGED")
    assert {k for k, v in f.items() if v == "NA" and k in old} == na


def test_the_verdict_times_the_perf_and_ragged_cases():
    from kopt.eval.bench import BenchOptions

    cf = load_file()
    perf, matrix, hidden, held = plan(cf, BenchOptions(device="cpu"))
    assert [c.id for c, _ in perf] == list(range(4, 22)) and held == []
    assert all(h.kind == "perf" and h.lengths is None for h, _ in hidden)
    n = len(perf) + len(matrix) + len(hidden)  # every row knows the run's size: a stopped run is no verdict
    assert {o.verdict_rows for _, o in perf + matrix + hidden} == {n} and len({o.run_id for _, o in perf + hidden}) == 1


def test_hidden_shapes_of_ragged_cases_drop_their_lengths():
    by_id = {c.id: c for c in load_file().cases}
    for c in (by_id[15], by_id[16], by_id[18]):
        h = hidden_variant(c)
        assert (h.kind, h.lengths, h.batch, h.seqlen_k) == ("perf", None, c.batch + 3, c.seqlen_k + 13)
        assert h.variant.seqlens.value == "ragged" and h.valid_keys == h.batch * h.seqlen_k  # lengths drawn per seed
    for h in hidden_cases([by_id[15], by_id[16], by_id[17], by_id[18]], 4, random.Random(1)):
        assert h.kind == "perf" and h.lengths is None and h.variant.seqlens.value == "ragged"
    assert reshaped(by_id[10], 2, 99).model_dump() == by_id[10].model_copy(update={"batch": 2,
                                                                                   "seqlen_k": 99}).model_dump()


def test_rows_record_their_case_kind():
    from kopt.records import machine_line

    assert CaseResult(row_id="x").case_kind is None  # older rows: uniform
    r = row(15, "ragged", 1.0)
    assert CaseResult.model_validate_json(r.model_dump_json()).case_kind == "ragged"
    assert "PCT_LIMIT:NA" in machine_line(r)


def test_the_cpu_check_runs_the_slow_baseline_once_per_case():
    """check_saved with base_once: the tolerance baseline runs on the first seed only; the other seeds take its
    relative error. A right output still passes, a wrong one still fails."""
    from types import SimpleNamespace

    from kopt.baselines import torch_attention
    from kopt.cases import Case
    from kopt.eval import checks
    from kopt.eval.jobs import SavedOutput
    from kopt.reference import reference
    from kopt.workload import make_workload

    case = Case(id=1, batch=2, seqlen_k=33, kv_heads=2, gqa=4, kind="edge")
    calls = []
    base = SimpleNamespace(fn=lambda w: calls.append(w.seed) or torch_attention(w))
    outs = [SavedOutput(file=str(s), seed=s, kind="correct") for s in (1, 2, 3)]
    right = lambda so: reference(make_workload(case, so.seed, "cpu")).to(make_workload(case, 1).q.dtype)  # noqa: E731
    got, _ = checks.check_saved(case, "cpu", base, outs, right, base_once=True)
    assert calls == [1] and [c.status for c in got] == [Status.ok] * 3 and all(c.tol for c in got)
    got, _ = checks.check_saved(case, "cpu", base, outs, lambda so: right(so) * 0 + 1, base_once=True)
    assert [c.status for c in got] == [Status.incorrect_numerical] * 3
    checks.check_saved(case, "cpu", base, outs, right)
    assert calls == [1, 1, 1, 2, 3], "without base_once every seed runs the baseline"
