"""End to end on the CPU: the shipped TileLang candidate through `kopt bench`, the line and the ledger row."""

import json
import re

from typer.testing import CliRunner

from conftest import CANDIDATES, SHIPPED
from kopt.cli.main import app
from kopt.records import CaseResult, parse_line
from kopt.store.ledger import load

LINE = re.compile(r"^COMPILED:True CORRECT:True BACKEND:tilelang RUNTIME:\d+\.\d{4} REF_RUNTIME:\d+\.\d{4} "
                  r"SPEEDUP:\d+\.\d{4}x CASE:(\d+) DEVICE:cpu REF:torch-cpu STATUS:ok( [A-Z_]+:\S+)*$")


def test_bench_shipped_candidate_case1_and_10(workspace):
    r = CliRunner().invoke(app, ["bench", "--case", "1,10", "--device", "cpu", "--machine",
                                 "--candidate", str(SHIPPED)])
    assert r.exit_code == 0, r.output
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 2
    assert [LINE.match(x).group(1) for x in lines] == ["1", "10"]
    rows = load(CaseResult, workspace / "candidates.jsonl")
    assert not rows.skipped and [x.case for x in rows.rows] == [1, 10]
    row = rows.rows[0]
    assert row.correct and row.mode == "signal" and row.device == "cpu" and row.ref == "torch-cpu"
    assert len(row.candidate_hash) == 64 and row.candidate_id == row.candidate_hash[:12]
    assert row.timing and row.timing.method == "host" and row.timing.n >= 1
    assert row.validation and row.validation.correct and row.validation.trials >= 1
    assert row.versions["tilelang"].startswith("0.1") and row.compile_s is not None
    assert row.plan == {"path": "c-target"}  # the candidate's plan_info hook, recorded in the row
    assert row.timing_sets == 2  # the CPU default: two input sets, each its own allocation (4 on a GPU)


def test_bench_json_and_paged_variant(workspace):
    r = CliRunner().invoke(app, ["bench", "--case", "3", "--device", "cpu", "--json", "--no-record", "--quick",
                                 "--page-size", "16", "--seqlens", "ragged", "--dtype", "bf16", "--timing-sets", "3",
                                 "--candidate", str(SHIPPED)])
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    res = obj["results"][0]
    assert res["correct"] and res["variant"] == "bf16-d128-paged16-ragged" and res["timing_sets"] == 3
    assert parse_line(obj["lines"][0])["STATUS"] == "ok"
    assert obj["overhead_s"]["wall_total"] > 0 and "child_wall" in res["overhead_s"]
    assert not (workspace / "candidates.jsonl").exists()


def test_failing_candidate_exit_1_line_still_printed(workspace, tmp_path):
    bad = tmp_path / "zeros.py"
    bad.write_text("import torch\nBACKEND='torch'\n"
                   "def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):\n"
                   "    return torch.zeros_like(q)\n")
    r = CliRunner().invoke(app, ["bench", "--case", "2", "--device", "cpu", "--machine", "--quick",
                                 "--candidate", str(bad)])
    assert r.exit_code == 1
    f = parse_line(r.stdout.strip())
    assert f["COMPILED"] == "True" and f["CORRECT"] == "False" and f["STATUS"] == "incorrect_numerical"
    assert load(CaseResult, workspace / "candidates.jsonl").rows[0].status.value == "incorrect_numerical"


def test_usage_errors_exit_2(workspace):
    runner = CliRunner()
    for args, msg in ([["bench", "--case", "99"], "valid ids"],
                      [["bench"], "--case"],
                      [["bench", "--case", "1", "--dtype", "fp8"], "dtype"],
                      [["bench", "--case", "1", "--candidate", "nope.py"], "not found"],
                      [["bench", "--case", "1", "--timing-sets", "1"], "--timing-sets"]):
        r = runner.invoke(app, args)
        assert r.exit_code == 2 and msg in str(r.exception) + r.output, (args, r.output)


def test_honest_torch_candidate_ok(workspace):
    r = CliRunner().invoke(app, ["bench", "--case", "2", "--device", "cpu", "--machine", "--quick", "--no-record",
                                 "--candidate", str(CANDIDATES / "torch_honest.py")])
    assert r.exit_code == 0, r.output
    assert parse_line(r.stdout.strip())["BACKEND"] == "torch"


def test_baseline_failure_is_baseline_error_not_a_candidate_failure():
    """The child reports a failed baseline explicitly; the row stays correct with SPEEDUP NA."""
    from kopt.cases import load_cases
    from kopt.eval import bench
    from kopt.eval.jobs import Outcome, WorkerResult
    from kopt.records import Status, TimingStats

    t = TimingStats(method="host", median_ms=1.0, q1_ms=1.0, q3_ms=1.0, min_ms=1.0, n=3, rel_iqr=0.0)
    res = WorkerResult(phase="done", status=Status.ok, timing=t, baseline_failed=True,
                       message="baseline torch-cpu failed: RuntimeError: x", compile_s=0.1)
    r = CaseResult(row_id="r", case=1)
    bench._fill_from_child(r, Outcome(res, 0, False, 1.0, ""), "cpu")
    bench._derive(r, load_cases()[0], "cpu")
    assert r.status == Status.baseline_error and r.correct and r.speedup is None and r.runtime_ms == 1.0


def test_candidate_id_covers_imported_sibling_modules(tmp_path):
    """Editing a module the candidate imports from its folder makes another candidate id; an
    unrelated file in that folder does not."""
    from kopt.candidate import content_hash, sources

    (tmp_path / "helper.py").write_text("X = 1\n")
    (tmp_path / "other.py").write_text("Y = 1\n")
    cand = tmp_path / "cand.py"
    cand.write_text("import torch\nimport helper\nBACKEND = 'torch'\n")
    assert [p.name for p in sources(cand)] == ["cand.py", "helper.py"]
    h0 = content_hash(cand)
    (tmp_path / "other.py").write_text("Y = 2\n")
    assert content_hash(cand) == h0
    (tmp_path / "helper.py").write_text("X = 2\n")
    assert content_hash(cand) != h0


def test_device_detection_without_torch_import():
    """`--device auto` asks the driver and torch/version.py before importing torch (seconds on some hosts)."""
    from kopt import hardware

    assert hardware._version_says_cuda("cuda: Optional[str] = '13.0'\n") is True
    assert hardware._version_says_cuda("debug = False\ncuda = '12.1'\n") is True
    assert hardware._version_says_cuda("cuda: Optional[str] = None\n") is False
    assert hardware._version_says_cuda("__version__ = '2.13.0'\n") is None
    assert hardware._torch_cuda_build() in (True, False, None)
    n = hardware._driver_gpu_count()
    assert isinstance(n, int) and n >= 0
    import torch

    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert hardware.resolve_device("auto") == expected and hardware.resolve_device("cpu") == "cpu"


def test_bench_times_a_verdicts_held_out_draw_by_its_id(workspace):
    """--case 100N --heldout-seed S benches draw N of that seed's held-out draw (cut to CPU size, as the CPU verdict
    cuts it) beside named cases: its line says CASE:100N and its row keeps the seed, the draw's variant and lengths."""
    from kopt import workloads

    want = workloads.draw(workloads.load(), 3, 9, cpu=True)[1]
    r = CliRunner().invoke(app, ["bench", "--case", "2,1002", "--heldout", "3", "--heldout-seed", "9", "--device",
                                 "cpu", "--machine", "--quick", "--candidate", str(CANDIDATES / "torch_honest.py")])
    assert r.exit_code == 0, r.output
    lines = [parse_line(x) for x in r.stdout.strip().splitlines()]
    assert [x["CASE"] for x in lines] == ["2", "1002"] and all(x["CORRECT"] == "True" for x in lines)
    held = [x for x in load(CaseResult, workspace / "candidates.jsonl").rows if x.case == 1002]
    assert len(held) == 1 and held[0].heldout_seed == 9 and held[0].variant == want.variant.label()
    assert held[0].shape == want.shape_label() and held[0].model == want.model
