"""`kopt lab ab`: which cases an A/B of two candidates must time (their plans on a device, no GPU), the lines of a timed
run, and its usage errors."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from conftest import SHIPPED, assert_clean, run_main


def _other(tmp_path):
    """A copy of the shipped kernel (with its tuning table two folders up) without the balanced kernel's small-paged
    rule: it plans differently exactly on the draws the shipped kernel plans balanced below BAL_MIN_PAGED_TILES."""
    other = tmp_path / "solution" / "tilelang"
    shutil.copytree(SHIPPED.parent, other, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "results" / "tilelang").mkdir(parents=True)
    shutil.copy(SHIPPED.parents[2] / "results" / "tilelang" / "tuning.csv", tmp_path / "results" / "tilelang")
    cuda = other / "tl_decode_cuda.py"
    cuda.write_text(cuda.read_text().replace("\nBAL_MIN_PAGED_TILES = 16\n", "\nBAL_MIN_PAGED_TILES = 1 << 30\n"))
    return other / "run_kernel.py"


def test_a_dry_run_lists_the_cases_whose_plans_differ(tmp_path):
    """--dry-run --plan-for H200: per group (the named cases, each seed's draw) the cases whose plans differ and the
    fields that move, then AB_PLAN with the count; the same cases `kopt workloads --against` marks."""
    from kopt.cases import load_cases
    from kopt.doctor import case_plans
    from kopt.lab import pick_cases

    other = _other(tmp_path)
    code, out, err = run_main(["lab", "ab", "--candidate", str(SHIPPED), "--against", str(other), "--seeds", "205,206",
                               "--case", "1-21", "--plan-for", "H200", "--dry-run"])
    assert_clean(code, out, err, allowed=(0,))
    want = {}
    for seed, ids in ((None, "1-21"), (205, "1001-1012"), (206, "1001-1012")):
        cases = pick_cases(ids, heldout=12 if seed else 0, seed=seed)
        want[seed] = [c.id for c, p in zip(cases, case_plans("H200", cases, SHIPPED))
                      if p["plan"]["balanced"] and p["plan"]["paged"] and c.shape_dict().get("page_size")
                      and p["plan"]["kernels"] != case_plans("H200", [c], other)[0]["plan"]["kernels"]]
    lines = out.splitlines()
    for seed, label in ((None, "named"), (205, "205"), (206, "206")):
        head = next(x for x in lines if x.startswith(f"{label}: "))
        ids = want[seed]
        assert head.endswith(f"{len(ids)} of {21 if seed is None else 12} cases to time on H200"
                             + (f": {','.join(map(str, ids))}" if ids else "")), (head, ids)
    assert sum(map(len, want.values())) > 0
    assert lines[-1] == f"AB_PLAN: CASES:{sum(map(len, want.values()))} OF:45 DEVICE:H200"
    assert all("balanced" in x for x in lines if x.startswith("  "))  # the fields that move name the kernel's switch
    assert len(load_cases()) >= 21
    # the process's imports are as they were: no module of the other copy is left for a later plain import to find
    import sys

    assert not [n for n, m in list(sys.modules.items())
                if str(getattr(m, "__file__", "") or "").startswith(str(tmp_path))]


def test_kernel_marks_the_cases_that_run_an_edited_kernel():
    """--kernel NAME: a change to one kernel's code moves no plan (the candidate against itself here), yet every case
    whose plan runs that kernel is to be timed, marked kernel=NAME; a kernel no case runs is a usage error naming
    the ones they do run."""
    from kopt.doctor import case_plans
    from kopt.lab import pick_cases

    code, out, err = run_main(["lab", "ab", "--candidate", str(SHIPPED), "--against", str(SHIPPED), "--seeds",
                               "205,206", "--plan-for", "H200", "--kernel", "decode_balanced", "--dry-run"])
    assert_clean(code, out, err, allowed=(0,))
    want = {s: [c.id for c, p in zip(cs, case_plans("H200", cs, SHIPPED)) if "decode_balanced" in p["plan"]["kernels"]]
            for s, cs in ((s, pick_cases("1001-1012", heldout=12, seed=s)) for s in (205, 206))}
    lines = out.splitlines()
    for seed, ids in want.items():
        head = next(x for x in lines if x.startswith(f"{seed}: "))
        assert head.endswith(f"{len(ids)} of 12 cases to time on H200" + (f": {','.join(map(str, ids))}" if ids
                                                                           else "")), (head, ids)
    n = sum(map(len, want.values()))
    assert n > 0 and lines[-1] == f"AB_PLAN: CASES:{n} OF:24 DEVICE:H200"
    assert [x for x in lines if x.startswith("  ")] == [f"  {i}: kernel=decode_balanced" for ids in want.values()
                                                         for i in ids]
    code, out, err = run_main(["lab", "ab", "--candidate", str(SHIPPED), "--against", str(SHIPPED), "--seeds", "205",
                               "--plan-for", "H200", "--kernel", "decode_direct,decode_nothing", "--dry-run"])
    assert_clean(code, out, err, allowed=(2,))
    assert "--kernel decode_nothing" in err and "decode_direct" in err and out == ""
    # a list: every case whose plan runs one of them, each marked with the one it runs
    code, out, err = run_main(["lab", "ab", "--candidate", str(SHIPPED), "--against", str(SHIPPED), "--seeds", "205",
                               "--plan-for", "H200", "--kernel", "decode_direct,decode_balanced", "--dry-run"])
    assert_clean(code, out, err, allowed=(0,))
    cases = pick_cases("1001-1012", heldout=12, seed=205)
    both = [(c.id, p["plan"]["kernels"][0]) for c, p in zip(cases, case_plans("H200", cases, SHIPPED))
            if p["plan"]["kernels"][0] in ("decode_direct", "decode_balanced")]
    assert [x for x in out.splitlines() if x.startswith("  ")] == [f"  {i}: kernel={k}" for i, k in both]
    assert len({k for _, k in both}) == 2


def test_lowered_marks_exactly_the_cases_an_edit_of_kernel_code_reaches(tmp_path):
    """--lowered: a copy of the shipped kernel whose balanced epilogue writes -0.0 for an empty row moves no plan, yet
    the cases whose kernels it lowers differently (real TileLang lowerings for sm_90a, no GPU) are to be timed, marked
    lowered: the balanced case, not the direct one. A candidate with no lower_plan hook cannot prove a case unchanged,
    so the case is listed with the reason."""
    from kopt.doctor import case_plans
    from kopt.lab import pick_cases

    other = _other(tmp_path)
    cuda = other.parent / "tl_decode_cuda.py"
    text = cuda.read_text().replace("\nBAL_MIN_PAGED_TILES = 1 << 30\n", "\nBAL_MIN_PAGED_TILES = 16\n")
    row = "Out[b, h * G + i, j] = T.cast(T.if_then_else(l_sum[i] > 0, acc_o[i, j] / l_sum[i], 0.0), dtype)"
    assert text.count(row) == 1  # the balanced kernel's epilogue of a one-split row, and no other kernel's
    cuda.write_text(text.replace(row, row.replace(", 0.0)", ", -0.0)")))
    cases = pick_cases("5,12")
    kernels = [p["plan"]["kernels"][0] for p in case_plans("H200", cases, SHIPPED)]
    assert kernels == ["decode_direct", "decode_balanced"], kernels
    code, out, err = run_main(["lab", "ab", "--candidate", str(other), "--against", str(SHIPPED), "--case", "5,12",
                               "--plan-for", "H200", "--lowered", "--dry-run"])
    assert_clean(code, out, err, allowed=(0,))
    assert out.splitlines() == ["named: 1 of 2 cases to time on H200: 12", "  12: lowered",
                                "AB_PLAN: CASES:1 OF:2 DEVICE:H200"], out
    assert "lowering 2 case(s) of named for H200" in err
    honest = SHIPPED.parents[2] / "tests" / "candidates" / "torch_honest.py"
    code, out, err = run_main(["lab", "ab", "--candidate", str(honest), "--against", str(honest), "--case", "5",
                               "--plan-for", "H200", "--lowered", "--dry-run"])
    assert_clean(code, out, err, allowed=(0,))
    assert "  5: lowered=NA (the candidate has no lower_plan hook)" in out.splitlines(), out


@pytest.mark.parametrize("argv, says", [
    (["--seeds", "x"], "--seeds takes seeds"),
    (["--seeds", "205", "--dry-run"], "--dry-run needs --plan-for"),
    (["--seeds", "205", "--plan-for", "X9", "--dry-run"], "no such GPU profile"),
    (["--seeds", "205", "--peers", "fa9"], "unknown peer"),
    (["--case", "99", "--plan-for", "H200", "--dry-run"], "99"),
    (["--case", "5", "--plan-for", "H200", "--dry-run", "--processes", "0"], "--processes"),
])
def test_lab_ab_usage_errors(argv, says, tmp_path):
    code, out, err = run_main(["lab", "ab", "--candidate", str(SHIPPED), "--against", str(SHIPPED), *argv])
    assert_clean(code, out, err, allowed=(2,))
    assert says in err and out == "", err


def test_lab_ab_times_on_a_gpu_only(monkeypatch):
    from kopt import hardware

    monkeypatch.setattr(hardware, "cuda_missing", lambda tool: f"{tool} needs a CUDA device")
    code, out, err = run_main(["lab", "ab", "--candidate", str(SHIPPED), "--against", str(SHIPPED), "--case", "2"])
    assert_clean(code, out, err, allowed=(2,))
    assert "kopt lab ab needs a CUDA device" in err and "--dry-run lists" in err


def test_the_ab_lines_and_the_summary():
    """A timed case's line carries both times and new over old with its CI; a wrong new candidate, an old one that did
    not run and an old one that was wrong are NA with the reason, never a ratio; the summary's geomean, min and max
    are over the cases that timed."""
    from kopt.lab.ab import case_line, summary_line
    from kopt.records import CaseResult

    base = {"row_id": "x", "mode": "peers", "kind": "case", "run_id": "r", "device": "H200", "candidate_id": "new",
            "status": "ok", "compiled": True, "correct": True, "runtime_ms": 0.01}

    def timing(ms):
        return {"method": "cupti", "median_ms": ms, "q1_ms": ms, "q3_ms": ms, "min_ms": ms, "n": 9, "rel_iqr": 0.0}

    def peer_entry(name, ms, sp, na=None, correct=True):  # the peer's ms, new over it sp
        if na:
            return {"peer": name, "ref": name, "na": na}
        return {"peer": name, "ref": name, "correct": correct, "timing": timing(ms / sp), "ref_timing": timing(ms),
                "speedup": sp, "speedup_ci": [sp * 0.99, sp * 1.01]}

    def row(case, peers, **kw):
        return CaseResult.model_validate({**base, "case": case, "peers": peers, **kw})

    old = "cand-old"
    line, r = case_line(205, row(1003, [peer_entry("fa2", 0.02, 2.0), peer_entry(old, 0.008, 0.8)]), old, "a,b")
    assert r == 0.8 and line.startswith("AB case=1003 seed=205 new_ms=0.0100 old_ms=0.0080 new_vs_old=0.800x "
                                        "ci=0.792-0.808 fields=a,b")
    line, r = case_line(None, row(5, [peer_entry(old, 0.012, 1.2)]), old, "x")
    assert r == 1.2 and "seed=named" in line
    for rw, why in ((row(6, [peer_entry(old, 0.01, 1.0)], correct=False), "the new candidate is wrong"),
                    (row(7, [peer_entry(old, 0, 0, na="does not import")]), "does not import"),
                    (row(8, [peer_entry(old, 0.01, 1.0, correct=False)]), "the old candidate is wrong"),
                    (row(9, [peer_entry("fa2", 0.02, 2.0)]), "did not time")):
        line, r = case_line(205, rw, old, "")
        assert r is None and "NA" in line and why in line, line
    s = summary_line([("205/1003", 0.8), ("named/5", 1.25), ("205/6", None)])
    assert s == "AB: CASES:3 TIMED:2 GEOMEAN:1.000x MIN:0.800x (205/1003) MAX:1.250x (named/5)"
    assert summary_line([("x", None)]) == "AB: CASES:1 TIMED:0 GEOMEAN:NA MIN:NA MAX:NA"


def test_a_case_the_run_never_reports_is_na_and_counted(monkeypatch, tmp_path):
    """run(): each changed case's line as its row arrives; a case whose row never comes back (the child stopped) is
    an NA line, counted in the summary, and the run is not ok; unchanged cases are never timed."""
    from kopt.candidate import candidate_id
    from kopt.cases import load_cases
    from kopt.eval import BenchOptions, bench
    from kopt.lab.ab import Group, run
    from kopt.records import CaseResult

    old = tmp_path / "old" / "run_kernel.py"
    old.parent.mkdir()
    old.write_text("def run(q, k_cache, v_cache, cache_seqlens):\n    return q\n")
    c2, c3, c4 = (c for c in load_cases() if c.id in (2, 3, 4))
    asked = []

    def fake(new, cases, opts, peers, on_result):
        asked.append(([c.id for c in cases], opts.heldout_seed, peers))
        t = {"method": "cupti", "median_ms": 0.01, "q1_ms": 0.01, "q3_ms": 0.01, "min_ms": 0.01, "n": 9,
             "rel_iqr": 0.0}
        peer = {"peer": f"cand-{candidate_id(old)}", "ref": "x", "correct": True, "timing": t,
                "ref_timing": {**t, "median_ms": 0.02}, "speedup": 2.0, "speedup_ci": [1.9, 2.1]}
        row = CaseResult.model_validate({"row_id": "x", "mode": "peers", "kind": "case", "run_id": "r",
                                         "device": "H200", "candidate_id": "new", "status": "ok", "compiled": True,
                                         "correct": True, "case": cases[0].id, "peers": [peer]})
        on_result(row)
        return [row]

    monkeypatch.setattr(bench, "evaluate_peers", fake)

    g = Group(None, [c2, c3, c4], {2: "block_N", 3: "", 4: "eager"})
    got = []
    lines, ok = run(SHIPPED, old, [g], BenchOptions(record=False), [], None, got.append)
    assert asked == [([2, 4], None, [str(old)])]  # case 3's plan is the same: not timed
    assert not ok and got == lines
    assert lines[0].startswith("AB case=2 seed=named new_ms=") and "new_vs_old=2.000x" in lines[0]
    assert lines[1] == "AB case=4 seed=named NA: no row came back (the run stopped before it)"
    assert lines[-1] == "AB: CASES:2 TIMED:1 GEOMEAN:2.000x MIN:2.000x (named/2) MAX:2.000x (named/2)"


@pytest.mark.gpu
def test_lab_ab_times_the_changed_cases_paired(tmp_path, workspace):
    """On a GPU: the cases that change are timed paired, each row correct, one AB line each and the summary, and the
    group's CSV written under --out (no timing is asserted)."""
    other = _other(tmp_path / "o")
    code, out, err = run_main(["lab", "ab", "--candidate", str(SHIPPED), "--against", str(other), "--seeds", "205",
                               "--quick", "--out", str(tmp_path / "ab")])
    assert_clean(code, out, err, allowed=(0,))
    timed = [x for x in out.splitlines() if x.startswith("AB case=")]
    plan = next(x for x in out.splitlines() if x.startswith("AB_PLAN:"))
    assert timed and all("new_vs_old=" in x for x in timed)
    assert f"CASES:{len(timed)} " in plan and out.splitlines()[-1].startswith(f"AB: CASES:{len(timed)} TIMED:")
    assert (tmp_path / "ab" / "205.csv").is_file()


def test_ptxas_report_and_ctas_a_unit():
    """kopt.occupancy reads ptxas' -v report per entry function and counts the CTAs a unit leaves room for: 128
    threads at 124 registers fit 4 on an sm_90 unit, at 136 only 3 (registers are allocated a warp at a time in blocks
    of 256); shared memory binds where it is the scarcer; an arch without a table row is a ValueError."""
    from kopt.occupancy import CudaKernel, ctas_a_unit, parse_ptxas

    log = ("ptxas info    : Compiling entry function 'decode_split_combine_kernel' for 'sm_90a'\n"
           "    0 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\nptxas info    : Used 124 registers\n"
           "ptxas info    : Compiling entry function 'decode_split_combine_kernel_1' for 'sm_90a'\n"
           "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\nptxas info    : Used 40 registers\n")
    assert parse_ptxas(log) == [CudaKernel("decode_split_combine_kernel", 124, 12),
                                CudaKernel("decode_split_combine_kernel_1", 40, 0)]
    assert ctas_a_unit(124, 128, 40960, "sm_90a", 233472) == (4, "registers")
    assert ctas_a_unit(136, 128, 40960, "sm_90a", 233472) == (3, "registers")
    assert ctas_a_unit(64, 128, 100 * 1024, "sm_90", 233472) == (2, "shared memory")
    assert ctas_a_unit(16, 32, 1024, "sm_90", None) == (32, "CTAs")
    assert ctas_a_unit(16, 1024, 1024, "sm_90", None) == (2, "threads")
    with pytest.raises(ValueError, match="sm_70"):
        ctas_a_unit(64, 128, 0, "sm_70", None)


def test_the_registers_line_flags_a_lost_cta():
    """--registers: old -> new registers and CTAs a unit; a unit's lost CTA and new spills are flagged; NA with the
    reason where either side has no compile."""
    from kopt.lab.ab import Resources, resources_line

    old, new = Resources("decode_direct", 124, 0, 4, "registers"), Resources("decode_direct", 136, 0, 3, "registers")
    assert resources_line(new, old) == ("registers 124 -> 136, CTAs a unit 4 -> 3 (bound: registers), "
                                        "FEWER CTAS A UNIT")
    assert resources_line(old, new) == "registers 136 -> 124, CTAs a unit 3 -> 4 (bound: registers)"
    spilled = Resources("decode_direct", 255, 64, 2, "registers")
    assert resources_line(spilled, old).endswith("FEWER CTAS A UNIT, SPILLS 0 -> 64 B")
    assert resources_line(Resources(na="RuntimeError: nvcc failed"), old) == "registers NA (RuntimeError: nvcc failed)"


@pytest.mark.skipif(shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists(),
                    reason="needs nvcc (the registers come from ptxas)")
def test_a_dry_run_with_registers_compiles_both_candidates():
    """--dry-run --registers on a machine with nvcc: each listed case's kernel of both candidates compiled for the
    device's arch; the same kernel on both sides reads the same registers and CTAs a unit, unflagged."""
    code, out, err = run_main(["lab", "ab", "--candidate", str(SHIPPED), "--against", str(SHIPPED), "--case", "7",
                               "--plan-for", "H200", "--kernel", "decode_direct", "--dry-run", "--registers"])
    assert_clean(code, out, err, allowed=(0,))
    line = next(x for x in out.splitlines() if x.startswith("  7: "))
    m = re.fullmatch(r"  7: kernel=decode_direct; registers (\d+) -> (\d+), CTAs a unit (\d+) -> (\d+) "
                     r"\(bound: [a-zA-Z ]+\)", line)
    assert m and m.group(1) == m.group(2) and m.group(3) == m.group(4) and int(m.group(3)) >= 1, line
    assert "compiling 1 case(s) of named for H200" in err and "ptxas info" not in out + err


def test_canonical_source_leaves_out_where_the_sync_pass_put_a_reductions_barrier():
    """Two lowerings of one kernel: the workspaces at other offsets and named in another order, so the sync pass's
    barrier guards the row sum's reduction in one and the row max's in the other. The canonical form without those
    barriers is one text; with them (the fixtures' form) the two still differ; a barrier before anything else stays."""
    from kopt.occupancy import canonical_source

    def src(first: bool, a: str, b: str) -> str:
        bar = "    __syncthreads();\n"
        return (f"  void* {a} = buf + 17920;\n  void* {b} = buf + 17408;\n"
                "    s[0] = 1.0f;\n    __syncthreads();\n    x = s[1];\n"
                + (bar if first else "") + f"    tl::AllReduce<tl::MaxOp, 128, 32>::run_batch(m, (float*){a});\n"
                + ("" if first else bar) + f"    tl::AllReduce<tl::SumOp, 128, 32>::run_batch(r, (float*){b});\n")

    one, two = src(True, "workspace", "workspace_1"), src(False, "workspace_1", "workspace")
    assert canonical_source(one) != canonical_source(two)
    assert canonical_source(one, barriers=False) == canonical_source(two, barriers=False)
    kept = canonical_source(one, barriers=False)
    assert kept.count("__syncthreads();") == 1 and "__syncthreads();\n    x = s[1];" in kept
    assert "17920" not in kept and "workspace_1" not in kept


def test_a_saved_selection_is_what_a_later_run_times(tmp_path):
    """--save-selection writes the cases to time; --selection takes them back without selecting again (a GPU host
    need not lower anything) and lists the same cases. A selection made for another device's plans or another
    candidate, a file that is not one, or --selection beside options that select is a usage error (exit 2, nothing
    printed, nothing written)."""
    sel = tmp_path / "sel.json"
    argv = ["lab", "ab", "--candidate", str(SHIPPED), "--against", str(SHIPPED), "--seeds", "205,206",
            "--case", "5,12", "--plan-for", "H200", "--kernel", "decode_balanced", "--dry-run"]
    code, first, err = run_main([*argv, "--save-selection", str(sel)])
    assert_clean(code, first, err, allowed=(0,))
    import json

    saved = json.loads(sel.read_text())
    assert saved["device"] == "H200" and [g["seed"] for g in saved["groups"]] == [None, 205, 206]
    assert sum(len(g["cases"]) for g in saved["groups"]) == int(first.splitlines()[-1].split("CASES:")[1].split()[0])
    assert all(why == "kernel=decode_balanced" for g in saved["groups"] for why in g["cases"].values())
    back = ["lab", "ab", "--candidate", str(SHIPPED), "--against", str(SHIPPED), "--selection", str(sel)]
    code, again, err = run_main([*back, "--plan-for", "H200", "--dry-run"])
    assert_clean(code, again, err, allowed=(0,))
    assert again == first and "lowering" not in err

    other = _other(tmp_path / "o")
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]\n")
    for extra, says in (
            (["--plan-for", "H100", "--dry-run"], "made for H200's plans, this run plans for H100"),
            (["--plan-for", "H200", "--dry-run", "--seeds", "205"], "drop --seeds"),
    ):
        code, out, err = run_main([*back, *extra])
        assert_clean(code, out, err, allowed=(2,))
        assert says in err and out == "", err
    code, out, err = run_main(["lab", "ab", "--candidate", str(other), "--against", str(SHIPPED), "--selection",
                               str(sel), "--plan-for", "H200", "--dry-run"])
    assert_clean(code, out, err, allowed=(2,))
    assert "was made for --candidate" in err and out == ""
    code, out, err = run_main([*back[:-1], str(bad), "--plan-for", "H200", "--dry-run"])
    assert_clean(code, out, err, allowed=(2,))
    assert "not a selection file" in err and out == ""
    missing = tmp_path / "no" / "sel.json"
    code, out, err = run_main([*argv, "--save-selection", str(missing)])
    assert_clean(code, out, err, allowed=(2,))
    assert "no folder" in err and out == "" and not missing.parent.exists()


def test_a_recorded_run_leaves_its_whole_record_beside_its_csvs(monkeypatch, tmp_path):
    """run() with rows recorded: each group's CSV, and ab.txt beside them: both candidates' ids and files as rows name
    them (a patched copy in kopt's cache as <kopt cache>/..., never the host's path), the device, time and versions of
    a row, the selection (cases and the fields that moved), then every AB line and the summary as printed."""
    from kopt.candidate import candidate_id
    from kopt.cases import load_cases
    from kopt.eval import BenchOptions, bench
    from kopt.lab.ab import Group, run
    from kopt.paths import cache_home
    from kopt.records import CaseResult

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("KOPT_WORKSPACE", str(SHIPPED.parents[2]))  # the repository's own workspace holds SHIPPED
    old = cache_home() / "patched" / "0123456789abcdef" / "solution" / "tilelang" / "run_kernel.py"
    old.parent.mkdir(parents=True)
    old.write_text("def run(q, k_cache, v_cache, cache_seqlens):\n    return q\n")
    c2, c4 = (c for c in load_cases() if c.id in (2, 4))
    t = {"method": "cupti", "median_ms": 0.01, "q1_ms": 0.01, "q3_ms": 0.01, "min_ms": 0.01, "n": 9, "rel_iqr": 0.0}

    def fake(new, cases, opts, peers, on_result):
        rows = []
        for c in cases:
            peer = {"peer": f"cand-{candidate_id(old)}", "ref": "x", "correct": True, "timing": t,
                    "ref_timing": {**t, "median_ms": 0.02}, "speedup": 2.0, "speedup_ci": [1.9, 2.1]}
            row = CaseResult.model_validate({
                "row_id": f"r{c.id}", "mode": "peers", "kind": "case", "run_id": "r", "device": "H200",
                "candidate_id": "new", "status": "ok", "compiled": True, "correct": True, "case": c.id,
                "variant": "fp16-d128-contig-full", "backend": "tilelang", "runtime_ms": 0.01, "ref_runtime_ms": 0.02,
                "speedup": 2.0, "ref": "x", "timestamp": "2026-12-07T05:26:42+00:00",
                "versions": {"torch": "2.11.0", "tilelang": "0.1.15"}, "peers": [peer]})
            on_result(row)
            rows.append(row)
        return rows

    monkeypatch.setattr(bench, "evaluate_peers", fake)
    out = tmp_path / "ab"
    g = Group(None, [c2, c4], {2: "block_N", 4: "eager,k_clamp"})
    lines, ok = run(SHIPPED, old, [g], BenchOptions(record=True), [], out, lambda _: None)
    assert ok and (out / "named.csv").is_file()
    log = (out / "ab.txt").read_text()
    head = log.splitlines()[:3]
    assert head[0] == (f"# kopt lab ab: {candidate_id(SHIPPED)} (solution/tilelang/run_kernel.py) against "
                       f"{candidate_id(old)} (<kopt cache>/patched/0123456789abcdef/solution/tilelang/run_kernel.py)")
    assert head[1].startswith("device H200, 2026-12-07T05:26:42+00:00, workspace commit ")
    assert head[2] == "versions: tilelang 0.1.15, torch 2.11.0"
    assert "named: 2 of 2 cases to time on H200: 2,4\n  2: block_N\n  4: eager,k_clamp\n" in log
    assert str(tmp_path) not in log
    assert log.endswith("\n".join(lines) + "\n") and lines[-1].startswith("AB: CASES:2 TIMED:2 GEOMEAN:2.000x")


def test_the_spread_over_processes():
    """Over several processes: a line a case with the median, min and max of its ratios and how many runs timed it
    (NA where none did), each case's median for the summary, and SPREAD: the widest max over min of one case (NA where
    no case timed twice)."""
    from kopt.lab.ab import spread_field, spread_lines

    ratios = [("20261206/1005", 1.03), ("named/12", 1.0), ("20261206/1005", 0.97), ("named/12", None),
              ("20261206/1005", 0.99), ("named/12", 1.002), ("205/7", None), ("205/7", None), ("205/7", None)]
    lines, medians = spread_lines(ratios, 3)
    assert lines == ["AB case=1005 seed=20261206 median=0.990x min=0.970x max=1.030x timed=3/3",
                     "AB case=12 seed=named median=1.001x min=1.000x max=1.002x timed=2/3",
                     "AB case=7 seed=205 NA: no run timed it (timed=0/3)"]
    assert medians == [("20261206/1005", 0.99), ("named/12", 1.001), ("205/7", None)]
    assert spread_field(ratios) == "SPREAD:1.062x (20261206/1005)"
    assert spread_field([("a/1", 1.0), ("a/2", None)]) == "SPREAD:NA"


def test_processes_time_every_group_in_a_new_child_each(monkeypatch, tmp_path):
    """run(processes=3): every group is timed three times, one child each; each line names its process; each
    process's CSV is its own; a case whose row one process lost is NA there and the run is not ok; the summary is over
    each case's median, with the processes and the spread, and ab.txt holds every line."""
    from kopt.candidate import candidate_id
    from kopt.cases import load_cases
    from kopt.eval import BenchOptions, bench
    from kopt.lab.ab import Group, run
    from kopt.paths import cache_home
    from kopt.records import CaseResult

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("KOPT_WORKSPACE", str(SHIPPED.parents[2]))
    old = cache_home() / "patched" / "0123456789abcdef" / "solution" / "tilelang" / "run_kernel.py"
    old.parent.mkdir(parents=True)
    old.write_text("def run(q, k_cache, v_cache, cache_seqlens):\n    return q\n")
    c2, c4 = (c for c in load_cases() if c.id in (2, 4))
    speed = iter([2.0, 1.0, 1.0, 1.0, 2.2])  # case 2 in processes 1-3, then case 4 in processes 1 and 3
    calls = []

    def fake(new, cases, opts, peers, on_result):
        calls.append([c.id for c in cases])
        rows = []
        for c in cases:
            if c.id == 4 and len(calls) == 2:  # process 2 loses case 4's row
                continue
            sp = next(speed)
            t = {"method": "cupti", "median_ms": 0.01, "q1_ms": 0.01, "q3_ms": 0.01, "min_ms": 0.01, "n": 9,
                 "rel_iqr": 0.0}
            peer = {"peer": f"cand-{candidate_id(old)}", "ref": "x", "correct": True, "timing": t,
                    "ref_timing": {**t, "median_ms": 0.01 * sp}, "speedup": sp, "speedup_ci": [sp, sp]}
            row = CaseResult.model_validate({
                "row_id": f"r{len(calls)}{c.id}", "mode": "peers", "kind": "case", "run_id": f"r{len(calls)}",
                "device": "H200", "candidate_id": "new", "status": "ok", "compiled": True, "correct": True,
                "case": c.id, "variant": "fp16-d128-contig-full", "backend": "tilelang", "runtime_ms": 0.01,
                "ref_runtime_ms": 0.02, "speedup": 2.0, "ref": "x", "timestamp": "2026-12-07T05:26:42+00:00",
                "versions": {"torch": "2.11.0"}, "peers": [peer]})
            on_result(row)
            rows.append(row)
        return rows

    monkeypatch.setattr(bench, "evaluate_peers", fake)
    out = tmp_path / "ab"
    got = []
    lines, ok = run(SHIPPED, old, [Group(None, [c2, c4], {2: "block_N", 4: "eager"})], BenchOptions(record=True), [],
                    out, got.append, processes=3)
    assert calls == [[2, 4], [2, 4], [2, 4]] and not ok and got == lines
    assert lines[0].startswith("AB case=2 seed=named new_ms=") and lines[0].endswith(" process=1/3")
    assert lines[3] == "AB case=4 seed=named NA: no row came back (the run stopped before it) process=2/3"
    assert lines[6:] == ["AB case=2 seed=named median=1.000x min=1.000x max=2.000x timed=3/3",
                         "AB case=4 seed=named median=1.600x min=1.000x max=2.200x timed=2/3",
                         "AB: CASES:2 TIMED:2 GEOMEAN:1.265x MIN:1.000x (named/2) MAX:1.600x (named/4) "
                         "PROCESSES:3 SPREAD:2.200x (named/4)"]
    assert sorted(f.name for f in out.glob("*.csv")) == ["named-p1.csv", "named-p2.csv", "named-p3.csv"]
    assert (out / "ab.txt").read_text().endswith("\n".join(lines) + "\n")
