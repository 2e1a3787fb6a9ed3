"""`kopt lab gpu-tests`: a small suite run for real in shards side by side (real pytest subprocesses): the deal by node
id, a test that fails only beside other shards and passes in the rerun, a test that fails anyway (exit 1, its reason
in the record), a shard stopped at its timeout, and the usage errors (one line, exit 2, nothing written)."""

from __future__ import annotations

import pytest
from test_lab import refused

from conftest import assert_clean, run_main

SUITE = '''\
import os
import time

import pytest


@pytest.mark.gpu
@pytest.mark.parametrize("i", range(5))
def test_many(i):
    assert i >= 0


@pytest.mark.gpu
def test_alone_only():
    assert "KOPT_GPU_TESTS_SHARD" not in os.environ, "out of memory beside the other shards"
    time.sleep(float(os.environ.get("SUITE_RERUN_SLEEP", "0")))


@pytest.mark.gpu
def test_broken():
    if os.environ.get("SUITE_BROKEN"):
        raise ValueError("broken for real")


@pytest.mark.gpu
def test_slow():
    time.sleep(float(os.environ.get("SUITE_SLEEP", "0")))


def test_not_gpu():
    pass
'''


@pytest.fixture
def suite(tmp_path, monkeypatch):
    root = tmp_path / "suite"
    (root / "tests").mkdir(parents=True)
    (root / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: needs a GPU\n")
    (root / "tests" / "test_suite.py").write_text(SUITE)
    # a warning at collection: pytest prints a warnings section after the node ids, which is not more tests
    (root / "tests" / "test_warns.py").write_text("import warnings\n\nimport pytest\n\nwarnings.warn('at collection', "
                                                  "DeprecationWarning)\n\n\n@pytest.mark.gpu\ndef test_w():\n"
                                                  "    pass\n")
    monkeypatch.chdir(root)
    for var in ("SUITE_BROKEN", "SUITE_SLEEP", "SUITE_RERUN_SLEEP", "KOPT_GPU_TESTS_SHARD"):
        monkeypatch.delenv(var, raising=False)
    return root


def test_the_deal_is_round_robin_and_never_makes_an_empty_shard():
    from kopt.lab.gpu_tests import deal

    assert deal(list("abcdefg"), 3) == [["a", "d", "g"], ["b", "e"], ["c", "f"]]
    assert deal(list("ab"), 12) == [["a"], ["b"]]


def test_pytest_summaries_parse_into_counts_and_reasons():
    from kopt.lab.gpu_tests import parse_output

    counts, failures, summary = parse_output(
        "..F\n=== short test summary info ===\n"
        "FAILED tests/x.py::test_a[1-fp16] - torch.OutOfMemoryError: CUDA out of memory\n"
        "ERROR tests/x.py::test_b\n"
        "== 1 failed, 31 passed, 2 skipped, 1 error, 370 deselected in 231.02s (0:03:51) ==\n")
    assert (counts.passed, counts.failed, counts.skipped, counts.errors) == (31, 1, 2, 1)
    assert [(f.node, f.reason) for f in failures] == [
        ("tests/x.py::test_a[1-fp16]", "torch.OutOfMemoryError: CUDA out of memory"), ("tests/x.py::test_b", "")]
    assert summary.startswith("1 failed, 31 passed")
    counts, _, _ = parse_output("== 3 passed, 1 xfailed, 1 xpassed in 0.50s ==\n")
    assert (counts.passed, counts.skipped, counts.failed) == (4, 1, 0)   # expected outcomes are not failures


def test_a_failure_side_by_side_that_passes_alone_passes_the_matrix(suite):
    out = suite / "record.txt"
    code, stdout, err = run_main(["lab", "gpu-tests", "tests", "--shards", "3", "--out", str(out)])
    assert_clean(code, stdout, err, allowed=(0,))
    lines = stdout.splitlines()
    assert lines[0] == "9 tests in 3 shard(s) side by side"   # test_not_gpu is not gpu-marked
    assert sum(x.startswith("shard ") for x in lines) == 3   # a progress line as each shard ends
    assert "1 failed side by side: rerun alone" in lines
    last = lines[-1]
    assert last.startswith("GPU_TESTS:pass COLLECTED:9 PASSED:9 FAILED:0 ERRORS:0 SKIPPED:0 SIDE_BY_SIDE_FAILED:1 "
                           "RERUN_PASSED:1 SHARDS:3 INCOMPLETE:NA"), last
    rec = out.read_text()
    assert "tests/test_suite.py::test_alone_only - AssertionError: out of memory beside the other shards" in rec
    assert "side by side: 8 passed, 1 failed" in rec and "after the rerun: 9 passed, 0 failed" in rec
    assert "## rerun alone (1 tests" in rec and rec.rstrip().endswith(last)
    assert "device cpu" in rec and "candidate NA" in rec   # the test workspace ships no candidate


def test_a_test_that_fails_alone_too_fails_the_matrix_with_its_reason(suite, monkeypatch):
    monkeypatch.setenv("SUITE_BROKEN", "1")
    out = suite / "record.txt"
    code, stdout, err = run_main(["lab", "gpu-tests", "tests", "--shards", "2", "-k", "broken or many",
                                  "--out", str(out)])
    assert_clean(code, stdout, err, allowed=(1,))
    assert stdout.splitlines()[-1].startswith("GPU_TESTS:fail COLLECTED:6 PASSED:5 FAILED:1 ")
    assert "still failing: tests/test_suite.py::test_broken - ValueError: broken for real" in out.read_text()


def test_a_shard_stopped_at_its_timeout_fails_the_matrix(suite, monkeypatch):
    monkeypatch.setenv("SUITE_SLEEP", "30")
    code, stdout, err = run_main(["lab", "gpu-tests", "tests", "--shards", "1", "-k", "slow", "--timeout", "3"])
    assert_clean(code, stdout, err, allowed=(1,))
    assert "shard 0/1: no summary (stopped at its timeout)" in stdout
    assert stdout.splitlines()[-1].startswith("GPU_TESTS:fail COLLECTED:1 PASSED:0 ")
    assert "INCOMPLETE:shard 0/1" in stdout.splitlines()[-1]


def test_the_budget_stops_the_rerun_and_the_record_is_still_written(suite, monkeypatch):
    monkeypatch.setenv("SUITE_RERUN_SLEEP", "120")
    out = suite / "record.txt"
    code, stdout, err = run_main(["lab", "gpu-tests", "tests", "--shards", "2", "-k", "alone or many",
                                  "--budget", "20", "--out", str(out)])
    assert_clean(code, stdout, err, allowed=(1,))
    last = stdout.splitlines()[-1]
    assert last.startswith("GPU_TESTS:fail ") and "INCOMPLETE:NA" not in last, last
    assert out.read_text().rstrip().endswith(last)


@pytest.mark.parametrize("argv, needle", [
    (["no/such/dir"], "no such test path: no/such/dir"),
    (["tests", "--shards", "0"], "--shards must be at least 1"),
    (["tests", "-k", "nothing_matches_this"], "no test of tests matches -m gpu -k 'nothing_matches_this'"),
    (["tests", "--out", "missing/record.txt"], "--out missing/record.txt: its folder does not exist"),
])
def test_bad_input_is_one_line_and_writes_nothing(suite, argv, needle):
    before = sorted(p.name for p in suite.rglob("*"))
    refused(["lab", "gpu-tests", *argv], needle)
    assert sorted(p.name for p in suite.rglob("*")) == before


def test_gpu_tests_has_help():
    code, out, err = run_main(["lab", "gpu-tests", "--help"])
    assert code == 0 and "--shards" in out and "rerun" in out


def test_a_matrix_that_only_skipped_is_na_not_a_pass(suite):
    (suite / "tests" / "test_skip.py").write_text("import pytest\n\n\n@pytest.mark.gpu\ndef test_needs_one():\n"
                                                  "    pytest.skip('no GPU')\n")
    code, stdout, err = run_main(["lab", "gpu-tests", "tests/test_skip.py", "--shards", "2"])
    assert_clean(code, stdout, err, allowed=(1,))
    lines = stdout.splitlines()
    assert lines[-2] == "no test ran: all 1 skipped (a GPU test skips on a host without one)"
    assert lines[-1].startswith("GPU_TESTS:NA COLLECTED:1 PASSED:0 FAILED:0 ERRORS:0 SKIPPED:1 ")
