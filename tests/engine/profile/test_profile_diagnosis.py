"""Six-dimension diagnosis on synthetic metric dicts: each dimension ok / watch / limiting / NA as expected."""

from __future__ import annotations

from pathlib import Path

import pytest

from kopt.profile import diagnosis as dg
from kopt.profile.models import KernelMetrics, Score
from kopt.profile.trace import CallSpan, KernelRow, TraceSummary

MiB = 1 << 20


def k(name="main", **m) -> KernelMetrics:
    return KernelMetrics(name=name, metrics={a: float(v) for a, v in m.items()})


def ev(*kernels, **kw) -> dg.Evidence:
    return dg.Evidence(kernels=list(kernels), units=kw.pop("units", 132), **kw)


def score(dim) -> str:
    return dim.score.value


# ---------------------------------------------------------------- 1 occupancy & launch geometry

def test_occupancy_small_grid_is_pattern_a():
    d = dg.occupancy(ev(), k(grid_size=32, block_size=128, achieved_occupancy_pct=6))
    assert score(d) == "limiting" and "A" in d.patterns and d.evidence["grid_per_unit"] == pytest.approx(32 / 132,
                                                                                                         rel=1e-3)


def test_occupancy_nearly_full_grid_is_watch_and_full_grid_ok():
    assert score(dg.occupancy(ev(), k(grid_size=128, achieved_occupancy_pct=30))) == "watch"
    d = dg.occupancy(ev(), k(grid_size=528, achieved_occupancy_pct=40))
    assert score(d) == "ok" and d.patterns == []


def test_occupancy_spills_and_shared_memory_limit():
    d = dg.occupancy(ev(), k(grid_size=528, local_load_bytes=4096, registers_per_thread=255))
    assert score(d) == "limiting" and "F" in d.patterns
    d = dg.occupancy(ev(), k(grid_size=528, limit_shared_mem=1, limit_registers=4, achieved_occupancy_pct=10))
    assert score(d) == "limiting" and "G" in d.patterns


def test_occupancy_na_without_a_kernel():
    assert score(dg.occupancy(ev(), None)) == "NA"


# ---------------------------------------------------------------- 2 tail effect

@pytest.mark.parametrize("waves,expected,pattern", [(0.3, "limiting", "A"), (0.97, "ok", None), (2.0, "ok", None),
                                                    (2.8, "ok", None), (2.6, "watch", "C"), (1.2, "limiting", "C")])
def test_tail_effect(waves, expected, pattern):
    d = dg.tail(ev(), k(grid_size=100, waves_per_sm=waves))
    assert score(d) == expected
    assert (pattern in d.patterns) if pattern else d.patterns == []


def test_geometry_is_not_limiting_at_the_roofline():
    d = dg.tail(ev(), k(grid_size=256, waves_per_sm=0.65, dram_pct=92))
    assert score(d) == "watch" and "DRAM already at 92%" in d.reason
    assert score(dg.occupancy(ev(), k(grid_size=64, dram_pct=90))) == "watch"


def test_tail_from_occupancy_limits_and_unknown_capacity():
    d = dg.tail(ev(), k(grid_size=264, limit_blocks=32, limit_registers=2, limit_shared_mem=3, limit_warps=16))
    assert d.evidence["waves"] == pytest.approx(1.0) and score(d) == "ok"
    assert score(dg.tail(ev(), k(grid_size=64))) == "limiting"          # fewer blocks than units
    assert score(dg.tail(ev(), k(grid_size=400))) == "NA"


# ---------------------------------------------------------------- 2b tail effect from the plan and the lengths

def test_split_work_follows_the_allocated_or_the_own_length():
    from kopt.profile.geometry import split_work

    # 2 splits of 64-key tiles; the cache holds 256 keys (4 tiles): eager chunks are 2 tiles of the allocation
    assert split_work([10, 0, 130], 1, 64, 2, 256, eager=True) == [10, 0, 0, 0, 128, 2]
    # own length: 130 keys are 3 tiles, chunks of 2 tiles; a 100-key row is 2 tiles, chunks of 1
    assert split_work([130, 100], 1, 64, 2, 256) == [128, 2, 64, 36]
    assert split_work([100], 2, 64, 2, 256, eager=True) == [100, 0, 100, 0]  # the row repeats per kv head
    assert sum(split_work([61519, 17, 17, 17], 4, 64, 16, 61519)) == 4 * (61519 + 3 * 17)


def test_balance_deals_ctas_in_waves():
    from kopt.profile.geometry import balance, plan_balance

    even = balance([5] * 8, 4)
    assert (even.busiest_keys, even.imbalance, even.idle_pct) == (10, 1.0, 0.0)
    one = balance([100, 1, 1, 1], 4)  # one long row: its unit works, the others wait
    assert one.busiest_keys == 100 and one.imbalance == pytest.approx(100 / (103 / 4))
    assert balance([], 4) is None and balance([0, 0], 4) is None
    b, why = plan_balance({"path": "c-target"}, [5], 1, 5, 132)
    assert b is None and "block_N" in why
    assert plan_balance({"block_N": 64, "num_splits": 2}, [5], 1, 5, None)[1] == "the unit count is unknown"


def test_ragged_case_15_plan_leaves_most_units_idle():
    """Case 15 (one 32768-key sequence, fifteen of 512) under 2 splits of 64-key tiles: the long row's
    16 CTAs carry most of the keys, so the busiest SM reads ~6.8x the mean: limiting, pattern C."""
    from kopt.cases import load_cases
    from kopt.profile.geometry import plan_balance

    c15 = next(c for c in load_cases() if c.id == 15)
    b, _ = plan_balance({"block_N": 64, "num_splits": 2, "eager": False}, c15.seq_lengths(), c15.kv_heads,
                        c15.seqlen_k, 132)
    assert b.ctas == 2 * 8 * 16 and b.imbalance == pytest.approx(6.79, abs=0.01)
    d = dg.tail(ev(balance=b), k(grid_size=256, waves_per_sm=0.97))
    assert score(d) == "limiting" and "C" in d.patterns and d.evidence["plan_imbalance"] == pytest.approx(6.788,
                                                                                                          abs=1e-3)
    assert "busiest SM reads 6.79x the mean keys" in d.reason and d.evidence["plan"].startswith("block_N 64 x 2")
    # the same grid on uniform lengths is even: the wave score alone (0.97 waves, ok) stays as it was
    u, _ = plan_balance({"block_N": 64, "num_splits": 2}, [32768] * 16, 8, 32768, 132)
    assert score(dg.tail(ev(balance=u), k(grid_size=256, waves_per_sm=0.97))) == "ok"


def test_tail_from_the_plan_alone_and_its_na_reason():
    from kopt.profile.geometry import balance

    d = dg.tail(ev(balance=balance([100, 1, 1, 1], 132)), None)  # no kernel recorded: the plan still scores
    assert score(d) == "limiting" and d.patterns == ["A"]       # 4 CTAs on 132 units
    d = dg.tail(ev(balance_na="no plan recorded"), k(grid_size=400))
    assert score(d) == "NA" and "plan-based balance NA: no plan recorded" in d.reason


def test_profile_reads_the_plan_from_the_ledger(workspace):
    from kopt.cases import load_cases
    from kopt.profile.runner import _balance
    from kopt.records import CaseResult
    from kopt.store import ledger

    c18 = next(c for c in load_cases() if c.id == 18)
    b, why = _balance(workspace, "abc", c18, 0, 132, "H200")
    assert b is None and "kopt bench --case 18" in why
    ledger.append(workspace / "candidates.jsonl", [CaseResult(
        row_id="r1", candidate_id="abc", case=18, variant=c18.variant.label(), device="H200",
        plan={"path": "cuda", "block_N": 64, "num_splits": 16, "eager": False})])
    b, why = _balance(workspace, "abc", c18, 0, 132, "H200")
    assert why == "" and b.ctas == 16 * 4 * 4 and b.imbalance > 2  # one long row of four
    assert _balance(workspace, "abc", c18, 0, 132, "B200")[0] is None  # a plan of another device is not used
    # a profile of another config reads that config's row, never the default plan's
    b, why = _balance(workspace, "abc", c18, 0, 132, "H200", {"block_N": 128})
    assert b is None and """kopt bench --case 18 --config '{"block_N": 128}'""" in why and "with that config" in why
    ledger.append(workspace / "candidates.jsonl", [CaseResult(
        row_id="r2", candidate_id="abc", case=18, variant=c18.variant.label(), device="H200", config={"block_N": 128},
        plan={"path": "cuda", "block_N": 128, "num_splits": 8, "eager": False})])
    b, why = _balance(workspace, "abc", c18, 0, 132, "H200", {"block_N": 128})
    assert why == "" and b.ctas == 8 * 4 * 4
    assert _balance(workspace, "abc", c18, 0, 132, "H200")[0].ctas == 16 * 4 * 4  # the default row still its own


# ---------------------------------------------------------------- 3 stall breakdown

def test_stalls_long_scoreboard_low_dram_full_grid_is_b():
    d = dg.stalls(ev(), k(stall_long_scoreboard=60, stall_wait=20, stall_barrier=20, dram_pct=40, grid_size=528,
                          waves_per_sm=2.0))
    assert score(d) == "limiting" and d.patterns == ["B"] and d.evidence["long_scoreboard_pct"] == 60


def test_stalls_long_scoreboard_small_grid_points_to_a():
    d = dg.stalls(ev(), k(stall_long_scoreboard=70, stall_wait=30, dram_pct=30, grid_size=32))
    assert score(d) == "limiting" and "A" in d.patterns


def test_stalls_long_scoreboard_at_roofline_is_ok():
    assert score(dg.stalls(ev(), k(stall_long_scoreboard=80, stall_wait=20, dram_pct=92, grid_size=528))) == "ok"


def test_stalls_short_scoreboard_and_math():
    d = dg.stalls(ev(), k(stall_short_scoreboard=50, stall_long_scoreboard=30, stall_wait=20))
    assert score(d) == "limiting" and d.patterns == ["E"]
    d = dg.stalls(ev(), k(stall_math_pipe_throttle=35, stall_long_scoreboard=33, stall_wait=32, sm_pct=20))
    assert score(d) == "watch" and d.patterns == ["K"]


def test_stalls_instruction_and_constant_fetch_is_n_whichever_reason_leads():
    """Case 5's one-tile kernel (H200): long scoreboard leads at 22%, but no_instruction + imc_miss are 32%:
    a finding of their own (pattern N) beside the leader's; below 25% together, none."""
    case5 = dict(stall_long_scoreboard=21.9, stall_wait=21.8, stall_imc_miss=18.6, stall_no_instruction=13.6,
                 stall_barrier=12.0, stall_short_scoreboard=12.1, dram_pct=18, grid_size=64)
    d = dg.stalls(ev(), k(**case5))
    assert score(d) == "limiting" and d.patterns == ["A", "B", "N"]  # the leader's letters stay, N joins them
    assert d.evidence["fetch_pct"] == pytest.approx(32.2, abs=0.1) and "instruction and constant fetch 32%" in d.reason
    d = dg.stalls(ev(), k(**(case5 | {"stall_imc_miss": 5.0, "stall_no_instruction": 5.0})))
    assert "N" not in d.patterns and "fetch_pct" not in d.evidence
    d = dg.stalls(ev(), k(stall_no_instruction=40, stall_imc_miss=20, stall_wait=40))  # fetch leads: a watch, N
    assert score(d) == "watch" and d.patterns == ["N"]


def test_the_recorded_case5_profile_reads_as_fetch_bound_too():
    """The committed ncu profile of case 5 (H200): its stall counters, diagnosed again, give pattern N."""
    import json

    p = Path(__file__).resolve().parents[3] / "results/tilelang/profiling/case5/20261201T180241/summary.json"
    if not p.is_file():
        pytest.skip("no recorded case-5 profile in this checkout")
    kern = KernelMetrics(**json.loads(p.read_text())["kernels"][0])
    d = dg.stalls(ev(), kern)
    assert "N" in d.patterns and 30 < d.evidence["fetch_pct"] < 35


def test_stalls_na_from_a_timeline_and_metax_proxy():
    assert score(dg.stalls(ev(), k(duration_ns=1000))) == "NA"
    d = dg.stalls(ev(), k(isu_stall_dnoc_wait=800, isu_stall_barrier=100))
    assert score(d) == "watch" and "approximate" in d.reason


# ---------------------------------------------------------------- 4 tensor cores

def test_tensor_scores():
    assert score(dg.tensor(ev(), k(tensor_pct=0, sm_pct=20, dram_pct=85))) == "ok"       # memory-bound: expected
    d = dg.tensor(ev(), k(tensor_pct=0.5, sm_pct=75, dram_pct=30))
    assert score(d) == "limiting" and d.patterns == ["K"]
    assert score(dg.tensor(ev(), k(tensor_pct=1, sm_pct=20, dram_pct=30))) == "watch"
    assert score(dg.tensor(ev(), k(tensor_pct=12))) == "ok"
    assert score(dg.tensor(ev(), k(duration_ns=5))) == "NA"


# ---------------------------------------------------------------- 5 SM timeline

def _tl(gap_pct: float, kernels=(("main", 9.0), ("combine", 1.0))) -> TraceSummary:
    span = 20.0
    busy = span * (1 - gap_pct / 100)
    rows = [KernelRow(n, 3, 3 * d, d, d, d, 0, 0) for n, d in kernels]
    calls = [CallSpan(i, len(kernels), span, busy, span - busy) for i in range(3)]
    return TraceSummary("kineto", "us", "device kernels", 6, 200.0, 30.0, rows, [], calls)


def test_timeline_gaps_and_combine():
    assert score(dg.timeline(ev(timeline=_tl(2)), None)) == "watch"                    # 2 kernels, small combine
    d = dg.timeline(ev(timeline=_tl(40)), None)
    assert score(d) == "limiting" and "H" in d.patterns
    d = dg.timeline(ev(timeline=_tl(0, (("main", 6.0), ("combine", 4.0)))), None)
    assert score(d) == "limiting" and "D" in d.patterns
    assert score(dg.timeline(ev(timeline=_tl(0, (("main", 6.0),))), None)) == "ok"


def test_timeline_from_ncu_kernels_and_sm_active():
    main, comb = k("split", duration_ns=9000, sm_active_pct=50), k("combine", duration_ns=7000)
    d = dg.timeline(ev(main, comb), main)
    assert score(d) == "limiting" and {"D", "A", "C"} <= set(d.patterns)
    assert score(dg.timeline(ev(), None)) == "NA"


# ---------------------------------------------------------------- 6 memory bandwidth

def test_memory_scores():
    kv = 64 * MiB
    base = dict(duration_ns=20000, dram_read_bytes=kv, dram_write_bytes=1024, dram_bytes=kv, grid_size=528)
    assert score(dg.memory(ev(kv_bytes=kv, out_bytes=4096, ideal_bytes=kv), k(dram_pct=88, **base))) == "ok"
    d = dg.memory(ev(kv_bytes=kv, out_bytes=4096, ideal_bytes=kv), k(dram_pct=60, **base))
    assert score(d) == "watch" and d.patterns == ["B"]
    d = dg.memory(ev(kv_bytes=kv, out_bytes=4096, ideal_bytes=kv, paged=True), k(dram_pct=30, **base))
    assert score(d) == "limiting" and d.patterns == ["B", "J"]
    d = dg.memory(ev(kv_bytes=kv, out_bytes=4096, ideal_bytes=kv), k(dram_pct=30, **{**base, "grid_size": 16}))
    assert d.patterns == ["A"]


def test_memory_redundant_reads_and_partials():
    kv = 64 * MiB
    d = dg.memory(ev(kv_bytes=kv, out_bytes=4096, ideal_bytes=kv),
                  k(dram_pct=90, dram_read_bytes=2 * kv, dram_write_bytes=8 * MiB, duration_ns=1e4, grid_size=528))
    assert score(d) == "limiting" and {"I", "L"} <= set(d.patterns)


def test_memory_tiny_case_and_timeline_bandwidth():
    d = dg.memory(ev(kv_bytes=2048, out_bytes=8192, ideal_bytes=18432), k(dram_pct=1, duration_ns=3000))
    assert score(d) == "watch" and d.patterns == ["H"]
    kv = 64 * MiB
    d = dg.memory(ev(kv_bytes=kv, ideal_bytes=kv, copy_ceiling_gbps=4000.0, timeline=_tl(0)), None)
    assert d.evidence["effective_gbps"] == pytest.approx(kv / 20e3) and score(d) == "ok"     # 3355 GB/s of 4000
    d = dg.memory(ev(kv_bytes=kv, ideal_bytes=kv, timeline=_tl(0)), None)
    assert score(d) == "NA" and "no measured copy ceiling" in d.reason


# ---------------------------------------------------------------- whole diagnosis

def test_diagnose_picks_the_dominant_kernel_and_scores_six():
    main = k("split", duration_ns=9000, grid_size=128, waves_per_sm=0.32, dram_pct=38, stall_long_scoreboard=5,
             stall_wait=10, tensor_pct=6, sm_active_pct=73)
    d = dg.diagnose(ev(main, k("combine", duration_ns=7000), kv_bytes=16 * MiB, ideal_bytes=16 * MiB))
    assert d.kernel == "split" and [x.key for x in d.dimensions] == list(dg.TITLES)
    assert all(x.score in Score for x in d.dimensions)
    assert {x.key for x in d.limiting()} >= {"tail", "timeline", "memory"}


def test_pattern_titles_from_the_checklist(tmp_path):
    p = tmp_path / "c.md"
    p.write_text("# x\n### A. Grid smaller than the unit count\ntext\n### B. Long-scoreboard stalls\n")
    assert dg.pattern_titles(p) == {"A": "Grid smaller than the unit count", "B": "Long-scoreboard stalls"}
    repo = Path(__file__).resolve().parents[3] / "knowledge" / "profiling" / "diagnosis_checklist.md"
    if repo.is_file():
        titles = dg.pattern_titles(repo)
        assert set("ABCDEFGHIJKLMN") <= set(titles)       # the letters the rules use exist in the checklist


def test_rendering_table_and_markdown():
    from rich.console import Console

    from kopt.profile.models import HotInstruction, ProfileSummary, Tool
    from kopt.profile.render import diagnosis_table, hot_table, summary_markdown

    main = k("split", duration_ns=9000, grid_size=32, waves_per_sm=0.2, dram_pct=30)
    d = dg.diagnose(ev(main, kv_bytes=16 * MiB, ideal_bytes=16 * MiB))
    con = Console(width=220, record=True)
    con.print(diagnosis_table(d, {"A": "Grid smaller than the unit count"}))
    text = con.export_text()
    assert "memory bandwidth" in text and "A (Grid smaller than the unit count)" in text and "limiting" in text
    s = ProfileSummary(case=10, tool=Tool.ncu, kernels=[main], diagnosis=d, notes=["n1"], files=["report_raw.csv"])
    md = summary_markdown(s, {})
    assert "| tail effect | **limiting** |" in md and "`split`" in md and "- n1" in md
    assert "Hot instructions" not in md
    s.hot = [HotInstruction(kernel="split", offset=0x39A0, sass="IMAD.SHL.U32 R40, R40, 0x200, RZ", samples=4,
                            share_pct=22.2, stalls={"long_sb": 3, "wait": 1}, waits_on="0x3990 DEPBAR.LE SB0, 0x1")]
    md = summary_markdown(s, {})
    assert ("| `split` | 0x39a0 | `IMAD.SHL.U32 R40, R40, 0x200, RZ` | 4 | 22.2 | long_sb 3, wait 1 | "
            "`0x3990 DEPBAR.LE SB0, 0x1` |") in md
    con = Console(width=220, record=True)
    con.print(hot_table(s.hot))
    text = con.export_text()
    assert "top 1 sampled instructions" in text and "IMAD.SHL.U32 R40, R40, 0x200, RZ" in text
    assert "DEPBAR.LE SB0, 0x1" in text and "long_sb 3, wait 1" in text


def test_real_h200_case10_profile_diagnoses_a_and_d():
    """The real ncu export and kineto trace of the shipped kernel on case 10 (split + combine, 128 CTAs)."""
    from kopt.profile import ncu
    from kopt.profile.trace import summarize_file

    fix = Path(__file__).resolve().parents[2] / "fixtures" / "traces"
    kernels = ncu.parse_csv((fix / "ncu_raw_h200_case10_real.csv").read_text())
    tl = summarize_file(fix / "kineto_cuda_h200_case10_real.json")
    kv = 2 * 8192 * 4 * 128 * 2
    d = dg.diagnose(dg.Evidence(kernels=kernels, timeline=tl, units=132, kv_bytes=kv, out_bytes=32 * 128 * 2,
                                ideal_bytes=kv + 2 * 32 * 128 * 2))
    dims = {x.key: x for x in d.dimensions}
    assert d.kernel == "decode_split_kernel"
    assert dims["tail"].score == Score.limiting and dims["tail"].patterns == ["A"]        # 0.32 waves
    assert dims["timeline"].score == Score.limiting and {"D", "H"} <= set(dims["timeline"].patterns)
    assert dims["memory"].score == Score.limiting and "A" in dims["memory"].patterns       # 39 % of DRAM peak
    assert dims["stalls"].score != Score.na and dims["tensor"].score != Score.na


def test_a_cpu_run_is_not_called_launch_bound():
    """A 16.6 ms CPU call: the C kernel is no torch op, so the gaps between torch ops are the kernel itself, and
    no copy ceiling is measured on the CPU: neither dimension may read 'launch-bound' or ask for a bench."""
    from types import SimpleNamespace

    from kopt.profile import diagnosis

    tl = SimpleNamespace(event_kind="cpu ops", call_stats=lambda: {"kernels_per_call": 9, "span_us": 16_600.0,
                                                                    "busy_us": 40.0, "gap_pct": 99.8})
    d = diagnosis.diagnose(diagnosis.Evidence(timeline=tl, vendor="cpu", ideal_bytes=1 << 20, kv_bytes=1 << 20,
                                              native_cpu=True))
    dims = {x.key: x for x in d.dimensions}
    assert dims["timeline"].score.value == "NA" and "not launches" in dims["timeline"].reason
    assert dims["memory"].score.value == "NA" and "run `kopt bench`" not in dims["memory"].reason
    assert not any("launch" in p for x in d.dimensions for p in x.patterns)
