"""The single-host GPU pool, with fake GPU ids and plain Python workers (no GPU needed)."""

import os
import time

import pytest

from kopt.errors import UsageError
from kopt.executor import pool as gpupool

FAKE = ["3", "5", "7"]


def probe(item):
    """What a pool worker sees: its pinned GPU, its pid, the item (slow enough that every worker gets some)."""
    time.sleep(0.05)
    if item == "raise":
        raise RuntimeError("item failed")
    if item == "die":
        os._exit(7)
    return os.environ.get(gpupool.ENV), os.getpid(), item


def test_plan_specs_and_fallbacks():
    msgs = []
    warn = msgs.append
    assert gpupool.plan(None, "cuda", FAKE, warn) == []
    assert gpupool.plan("1", "cuda", FAKE, warn) == []
    assert gpupool.plan("all", "cuda", FAKE, warn) == FAKE
    assert gpupool.plan("2", "cuda", FAKE, warn) == FAKE[:2]
    assert not msgs
    assert gpupool.plan("8", "cuda", FAKE, warn) == FAKE and "only 3 GPUs" in msgs[-1]
    assert gpupool.plan("2", "cpu", FAKE, warn) == [] and "CPU run" in msgs[-1] and "serially" in msgs[-1]
    assert gpupool.plan("all", "cuda", ["0"], warn) == [] and "1 GPU visible" in msgs[-1]
    assert len(msgs) == 3 and all("\n" not in m for m in msgs)
    for bad in ("0", "-2", "two"):
        with pytest.raises(UsageError):
            gpupool.plan(bad, "cuda", FAKE, warn)


def test_visible_gpus_on_this_machine(monkeypatch):
    monkeypatch.setenv(gpupool.ENV, "0,1")
    got = gpupool.visible_gpus()
    assert got == ["0", "1"][:len(got)]          # [] here without CUDA; never more than the env allows


def test_every_item_once_each_worker_pinned():
    items = list(range(12))
    seen = []
    res = gpupool.run(probe, items, FAKE, on_result=seen.append)
    assert [r.index for r in res] == items and sorted(r.index for r in seen) == items
    assert all(r.error is None for r in res)
    assert [r.value[2] for r in res] == items
    for r in res:
        assert r.value[0] == r.gpu                # CUDA_VISIBLE_DEVICES is the worker's own GPU
    pids = {}
    for r in res:
        pids.setdefault(r.gpu, set()).add(r.value[1])
    assert set(pids) == set(FAKE)                 # every GPU worked
    assert all(len(p) == 1 for p in pids.values())   # one process per GPU
    assert len(set.union(*pids.values())) == len(FAKE)


def test_failures_are_results_and_a_dead_worker_is_replaced():
    items = ["a", "raise", "b", "die", "c", "d", "e"]
    res = gpupool.run(probe, items, FAKE[:2])
    assert [r.index for r in res] == list(range(len(items)))
    assert "item failed" in res[1].error
    assert "died" in res[3].error and "exit code 7" in res[3].error
    ok = [r for i, r in enumerate(res) if i not in (1, 3)]
    assert all(r.error is None and r.value[0] == r.gpu for r in ok)
    assert [r.value[2] for r in ok] == ["a", "b", "c", "d", "e"]


def test_run_needs_gpus():
    with pytest.raises(ValueError):
        gpupool.run(probe, [1], [])


def test_spread_verdict_has_the_same_groups(workspace):
    """The Verdict over a pool (fake GPU ids, CPU runs): perf, matrix and hidden rows, in order, recorded."""
    from conftest import CANDIDATES
    from kopt.cases import CaseFile, MatrixEntry, VerifySpec, load_cases, select
    from kopt.eval import verdict
    from kopt.eval.bench import BenchOptions
    from kopt.records import CaseResult
    from kopt.store.ledger import load

    cf = CaseFile(cases=select(load_cases(), [2, 3]),
                  verify=VerifySpec(seeds=1, matrix=[MatrixEntry(cases=[3], dtype="bf16")], hidden=1))
    seen = []
    v = verdict.run_on_gpus(CANDIDATES / "torch_honest.py", cf, BenchOptions(device="cpu", quick=True), [2],
                            seen.append, ["0", "1"])
    assert [r.case for r in v.perf] == [2] and [r.case for r in v.matrix] == [3] and len(v.hidden) == 1
    assert v.passed and len(seen) == 3 and all(r.mode == "verdict" for r in v.rows)
    assert v.matrix[0].variant.startswith("bf16") and v.matrix[0].variant.endswith("-matrix")
    assert "-ragged-hidden-b" in v.hidden[0].variant
    assert len(load(CaseResult, workspace / "candidates.jsonl").rows) == 3
