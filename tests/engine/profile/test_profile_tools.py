"""Profiler adapters without a GPU: command lines, tool choice, ncu failure handling (fake ncu), parsers."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from kopt.profile import metax, ncu, sass
from kopt.profile.common import ProfileError, TargetSpec
from kopt.profile.models import Tool
from kopt.profile.runner import choose_tool, declared_backend, output_dir

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "traces"
SOURCE_FIX = "ncu_source_h100_case1001_trimmed.csv"
TARGET = TargetSpec(candidate=Path("cand.py"), case=10, device="cuda", dtype="fp16", page_size=0).argv("python3")


def test_target_argv():
    assert TARGET[:3] == ["python3", "-m", "kopt.profile.target"]
    assert TARGET[TARGET.index("--case") + 1] == "10"
    assert TARGET[TARGET.index("--page-size") + 1] == "0"
    assert "--head-dim" not in TARGET


def test_ncu_command_line():
    cmd = ncu.profile_command("ncu", Path("out/report"), TARGET)
    assert cmd[0] == "ncu"
    assert cmd[cmd.index("--nvtx-include") + 1] == "kopt_call/"   # push/pop ranges need the trailing slash
    assert "--nvtx" in cmd and cmd[cmd.index("--clock-control") + 1] == "none"
    assert cmd[cmd.index("--target-processes") + 1] == "all"
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--section"] == list(ncu.SECTIONS)
    metrics = cmd[cmd.index("--metrics") + 1].split(",")
    for name in ("gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed", "dram__bytes.sum",
                 "sm__warps_active.avg.pct_of_peak_sustained_active", "launch__waves_per_multiprocessor",
                 "launch__grid_size", "launch__block_size", "launch__registers_per_thread",
                 "launch__shared_mem_per_block_static", "launch__shared_mem_per_block_dynamic",
                 "smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio",
                 "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
                 "lts__t_sector_hit_rate.pct", "sm__throughput.avg.pct_of_peak_sustained_elapsed"):
        assert name in metrics
    assert cmd[cmd.index("--export") + 1] == str(Path("out/report")) and "--force-overwrite" in cmd
    assert cmd[-len(TARGET):] == TARGET
    imp = ncu.import_command("ncu", Path("r.ncu-rep"))
    assert imp == ["ncu", "--import", "r.ncu-rep", "--page", "raw", "--csv", "--print-units", "base"]
    src = ncu.import_command("ncu", Path("r.ncu-rep"), "source")
    assert src == ["ncu", "--import", "r.ncu-rep", "--page", "source", "--csv", "--print-source", "sass"]


def test_metax_command_lines(tmp_path):
    cmd = metax.mcprofiler_command("mcProfiler", TARGET, "kopt_case10", tmp_path, kernel_name="decode")
    assert cmd[:2] == ["mcProfiler", "perf_exec"]
    assert cmd[cmd.index("--cmdline") + 1].startswith("python3 -m kopt.profile.target --candidate cand.py")
    i = cmd.index("--metrics")
    assert "AP MMA Duty ratio" in cmd[i + 1:cmd.index("--counts")] and metax.ISU_STALLS in cmd
    assert "--per-kernel" in cmd and cmd[cmd.index("--kernelname") + 1] == "decode"
    assert cmd[cmd.index("--cwd") + 1] == str(tmp_path)
    assert metax.mctracer_command("mcTracer", TARGET) == ["mcTracer", "--mctx", "--odname", "mctracer", *TARGET]


def test_choose_tool(monkeypatch):
    from kopt.errors import UsageError

    monkeypatch.setattr(ncu, "find_ncu", lambda: None)
    assert choose_tool("auto", "cpu", "cpu")[0] == Tool.torch
    tool, notes = choose_tool("auto", "cuda", "nvidia")
    assert tool == Tool.torch and "ncu not on PATH" in notes[0]
    with pytest.raises(UsageError, match="not on PATH"):
        choose_tool("ncu", "cuda", "nvidia")
    with pytest.raises(UsageError, match="needs a CUDA device"):
        choose_tool("ncu", "cpu", "cpu")
    monkeypatch.setattr(ncu, "find_ncu", lambda: "/x/ncu")
    assert choose_tool("auto", "cuda", "nvidia") == (Tool.ncu, [])
    monkeypatch.setattr(metax, "find_mcprofiler", lambda: None)
    monkeypatch.setattr(metax, "find_mctracer", lambda: "/x/mcTracer")
    assert choose_tool("auto", "cuda", "metax")[0] == Tool.mctracer
    with pytest.raises(UsageError, match="mcProfiler is not on PATH"):
        choose_tool("mcprofiler", "cuda", "metax")
    with pytest.raises(UsageError):
        choose_tool("nsys", "cuda", "nvidia")


def test_declared_backend_and_output_dir(tmp_path):
    f = tmp_path / "c.py"
    f.write_text("import torch\nBACKEND = 'tilelang'\ndef run(): pass\n")
    assert declared_backend(f) == "tilelang"
    f.write_text("def run(): pass\n")
    assert declared_backend(f) == "NA"
    from datetime import datetime, timezone

    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    a, b = output_dir(tmp_path, "tilelang", 10, now), output_dir(tmp_path, "tilelang", 10, now)
    assert a == tmp_path / "results/tilelang/profiling/case10/20260102T030405" and b.name == "20260102T030405-1"


FAKE_NCU = r'''#!{py}
import os, sys, time
a = sys.argv[1:]
mode = os.environ.get("FAKE_NCU_MODE", "ok")
if "--import" in a and "source" in a:
    if mode == "nosource":
        print("==ERROR== no source counters in this report")
        sys.exit(1)
    print(open(os.environ["FAKE_NCU_SOURCE"]).read())
    sys.exit(0)
if "--import" in a:
    print(open(os.environ["FAKE_NCU_CSV"]).read() if "raw" in a else "details page")
    sys.exit(0)
if mode == "sleep":
    time.sleep(30)
if mode == "perm":
    print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters")
    sys.exit(1)
metrics = a[a.index("--metrics") + 1] if "--metrics" in a else ""
if mode == "unknown" and "sm__pipe_tensor_op_hmma_cycles_active" in metrics:
    print("==ERROR== Failed to find metric sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active")
    sys.exit(1)
if mode == "target":
    print("kopt-target: error: CandidateLoadError: candidate has no callable `run`")
    sys.exit(1)
if mode != "norep":
    open(a[a.index("--export") + 1] + ".ncu-rep", "w").write("rep")
print("==PROF== Disconnected")
'''


@pytest.fixture
def fake_ncu(tmp_path, monkeypatch) -> Path:
    p = tmp_path / "ncu"
    p.write_text(FAKE_NCU.replace("{py}", sys.executable))
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("FAKE_NCU_CSV", str(FIX / "ncu_raw_synthetic.csv"))
    monkeypatch.setenv("FAKE_NCU_SOURCE", str(FIX / SOURCE_FIX))
    return p


def test_ncu_run_parses_and_keeps_raw_files(fake_ncu, tmp_path, monkeypatch):
    out = tmp_path / "o"
    out.mkdir()
    r = ncu.run(str(fake_ncu), out, TARGET, timeout_s=30)
    assert [k.name for k in r.kernels] == ["decode_split_kernel", "combine_kernel"]
    assert {"report.ncu-rep", "report_raw.csv", "ncu.log", "report_details.txt"} <= set(r.files)
    assert (out / "report_raw.csv").read_text().count("decode_split_kernel") == 1
    k = r.kernels[0]
    assert k.metrics["duration_ns"] == pytest.approx(12500.0)      # 12.5 usecond
    assert "tensor_pct" in k.missing and "tensor_pct" not in k.metrics   # n/a -> NA with a reason


def test_ncu_run_source_collects_stalls_per_instruction_and_exports_them(fake_ncu, tmp_path, monkeypatch):
    """source=True adds the SourceCounters section to the collection and writes the SASS source page beside the
    counters; without it neither happens; a source page ncu cannot export is a NA note, the counters stand."""
    plain, with_src = tmp_path / "plain", tmp_path / "src"
    plain.mkdir()
    with_src.mkdir()
    r = ncu.run(str(fake_ncu), plain, TARGET, timeout_s=30)
    assert ncu.SOURCE_SECTION not in r.commands[0] and ncu.SOURCE_FILE not in r.files
    assert not (plain / ncu.SOURCE_FILE).exists()
    assert "--warp-sampling-interval" not in r.commands[0] and not r.hot
    r = ncu.run(str(fake_ncu), with_src, TARGET, timeout_s=30, source=True)
    sections = [r.commands[0][i + 1] for i, a in enumerate(r.commands[0]) if a == "--section"]
    assert sections == [*ncu.SECTIONS, ncu.SOURCE_SECTION]
    i = r.commands[0].index("--warp-sampling-interval")
    assert r.commands[0][i + 1] == "0"                      # ncu's finest: one sample every 32 cycles
    assert r.commands[-1][-5:] == ["--page", "source", "--csv", "--print-source", "sass"]
    assert ncu.SOURCE_FILE in r.files and "IMAD.SHL.U32 R40" in (with_src / ncu.SOURCE_FILE).read_text()
    assert [k.name for k in r.kernels] == ["decode_split_kernel", "combine_kernel"]
    assert r.hot[0].sass == "LDC R1, c[0x0][0x28]" and r.hot[0].samples == 4
    assert r.notes == ["warp samples per kernel (one every 32 cycles): decode_direct_kernel 18",
                       "fewer than 200 warp samples in decode_direct_kernel: its hot-instruction shares are coarse"]
    monkeypatch.setenv("FAKE_NCU_MODE", "nosource")
    gone = tmp_path / "gone"
    gone.mkdir()
    r = ncu.run(str(fake_ncu), gone, TARGET, timeout_s=30, source=True)
    assert ncu.SOURCE_FILE not in r.files and not (gone / ncu.SOURCE_FILE).exists()
    assert r.notes == [f"{ncu.SOURCE_FILE}: NA, ncu's source page export failed "
                       "(==ERROR== no source counters in this report)"]
    assert r.kernels


def test_parse_source_ranks_a_real_export_by_sampled_stalls():
    """The source page of an H100 profile (trimmed to its sampled rows): offsets from the kernel's first instruction,
    shares of the kernel's samples, stall reasons largest first with zeros left out."""
    hot, totals = sass.parse_source((FIX / SOURCE_FIX).read_text())
    assert totals == {"decode_direct_kernel": 18} and sum(h.samples for h in hot) == 18
    assert [h.samples for h in hot] == sorted((h.samples for h in hot), reverse=True)
    ld = next(h for h in hot if h.sass.startswith("IMAD.SHL.U32 R40"))
    assert (ld.offset, ld.samples, ld.share_pct, ld.stalls) == (0x39A0, 4, 22.2, {"long_sb": 4})
    assert ld.waits_on == "0x3990 DEPBAR.LE SB0, 0x1"         # the cp.async group wait right before it
    add = next(h for h in hot if h.sass == "FADD.FTZ R0, R41, R0")
    assert add.stalls == {"short_sb": 1} and add.waits_on == "0x4850 SHFL.BFLY PT, R0, R41, 0x2, 0x1f"
    assert next(h for h in hot if h.sass.startswith("LDC R1")).waits_on == ""   # reads no register
    assert hot[0].offset == 0 and len(sass.parse_source((FIX / SOURCE_FIX).read_text(), top=3)[0]) == 3


@pytest.mark.parametrize("code,at,want", [
    (["LDG.E R4, desc[UR4][R2.64]", "IADD3 R6, R6, 0x1, RZ", "FADD R8, R4, R6"], 2, 1),    # the nearest writer of R6
    (["LDG.E R4, desc[UR4][R2.64]", "IADD3 R6, R7, 0x1, RZ", "FADD R8, R4, R9"], 2, 0),    # R4 from the load
    (["LDG.E.64 R4, desc[UR4][R2.64]", "FADD R8, R5, R9"], 1, 0),                         # R5 of a 64-bit load
    (["LDS.128 R8, [R2]", "FADD R0, R11, R9"], 1, 0),                                     # R11 of a 128-bit load
    (["LDG.E R4, desc[UR4][R2.64]", "FADD R8, R5, R9"], 1, None),                         # a 32-bit load: R4 only
    (["MOV R4, 0x1", "STG.E desc[UR4][R4.64], R4", "FADD R8, R5, R9"], 2, None),           # a store writes no R4/R5
    (["MOV R4, 0x1", "BAR.SYNC.DEFER_BLOCKING 0x0", "FADD R8, R4, R9"], 2, 1),             # behind the barrier
    (["MOV R4, 0x1", "ISETP.GE.AND P0, PT, R4, 0x2, PT", "@P0 FADD R8, R4, R9"], 2, 0),    # ISETP writes P0 only
    (["SHFL.BFLY PT, R4, R3, 0x2, 0x1f", "FADD R8, R4, R9"], 1, 0),                        # SHFL writes R4
    (["MOV R4, 0x1", "FADD R8, RZ, R9"], 1, None),                                         # RZ is no register
])
def test_waits_on_reads_the_dependence_from_the_sass(code, at, want):
    assert sass.waits_on(code, at) == want


def test_waits_on_looks_back_only_so_far():
    code = ["LDG.E R4, desc[UR4][R2.64]"] + ["NOP"] * sass.WRITER_WINDOW + ["FADD R8, R4, R9"]
    assert sass.waits_on(code, len(code) - 1) is None
    assert sass.waits_on(code[:1] + code[2:], len(code) - 2) == 0      # one instruction nearer: found


def test_a_full_sample_buffer_is_a_note():
    raw = ('"ID","Kernel Name","smsp__pcsamp_dropped_bytes","smsp__pcsamp_sample_count"\n'
           '"","","byte",""\n"0","k","{}","1,203"\n"1","c","0","18"\n')
    assert ncu.dropped_samples_note(raw.format("0")) == []
    assert ncu.dropped_samples_note(raw.format("4,096")) == [
        "ncu dropped 4,096 bytes of warp samples (its buffer was full): the hot-instruction shares undercount"]
    assert ncu.dropped_samples_note('"ID","Kernel Name"\n"0","k"\n') == []       # not collected: nothing to say


def test_parse_source_keeps_kernels_apart_and_rejects_a_page_without_samples():
    text = (FIX / SOURCE_FIX).read_text()
    two = text + text.replace('"decode_direct_kernel"', '"combine_kernel"', 1)
    hot, totals = sass.parse_source(two, top=100)
    assert totals == {"decode_direct_kernel": 18, "combine_kernel": 18}
    assert {h.kernel for h in hot} == {"decode_direct_kernel", "combine_kernel"} and len(hot) == 2 * 11
    with pytest.raises(ProfileError, match="no 'Warp Stall Sampling"):
        sass.parse_source('"Kernel Name","k",""\n"Address","Source"\n"0x10","NOP"\n')
    with pytest.raises(ProfileError, match="no \"Kernel Name\" block"):
        sass.parse_source('"Address","Source"\n')


def test_ncu_run_drops_unknown_metrics_and_retries(fake_ncu, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_NCU_MODE", "unknown")
    r = ncu.run(str(fake_ncu), tmp_path, TARGET, timeout_s=30)
    assert len(r.commands) == 3 and "dropped 1 metric" in r.notes[0]      # two collections + the import
    assert "rejected by this ncu version" in r.kernels[0].missing["tensor_pct"]


@pytest.mark.parametrize("mode,match", [("perm", "ERR_NVGPUCTRPERM"), ("norep", "no kernel ran inside NVTX"),
                                        ("target", "the profiled target failed: CandidateLoadError")])
def test_ncu_run_failures_are_one_line_errors(fake_ncu, tmp_path, monkeypatch, mode, match):
    monkeypatch.setenv("FAKE_NCU_MODE", mode)
    with pytest.raises(ProfileError, match=match):
        ncu.run(str(fake_ncu), tmp_path, TARGET, timeout_s=30)
    assert (tmp_path / "ncu.log").is_file()


def test_ncu_run_timeout(fake_ncu, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_NCU_MODE", "sleep")
    with pytest.raises(ProfileError, match="timed out after 1 s"):
        ncu.run(str(fake_ncu), tmp_path, TARGET, timeout_s=1)


def test_parse_ncu_csv_synthetic():
    ks = ncu.parse_csv((FIX / "ncu_raw_synthetic.csv").read_text())
    split, comb = ks
    assert split.launch_id == 0 and split.metrics["grid_size"] == 64 and split.metrics["sm_count"] == 132
    assert split.metrics["dram_bytes"] == pytest.approx(16.9e6)                  # Mbyte -> bytes
    assert split.metrics["dram_read_bytes"] == 16814592                          # thousands separators
    assert split.metrics["stall_long_scoreboard"] == pytest.approx(24.8)         # per-issue family fallback
    assert split.raw["kopt:stall_family"].startswith("per_issue")
    assert comb.metrics["tensor_pct"] == 0.0 and split.metrics["tensor_pct"] is None


def test_parse_ncu_csv_real_h200():
    ks = ncu.parse_csv((FIX / "ncu_raw_h200_case10_real.csv").read_text())
    assert [k.name for k in ks] == ["decode_split_kernel", "combine_kernel"]
    m = ks[0].metrics
    assert m["grid_size"] == 128 and m["block_size"] == 128 and m["sm_count"] == 132
    assert m["duration_ns"] > 1000 and 0 < m["dram_pct"] < 100
    assert m["stall_long_scoreboard"] > 0 and "kopt:stall_family" not in ks[0].raw
    # every curated metric came back on the H200, but the two added after this capture (2026-12-03)
    assert set(ncu.METRICS) - set(m) == {"inst_executed", "lsu_inst"}


def test_parse_ncu_csv_real_h200_with_instruction_counts():
    """A later capture (the balanced kernel of R1 in 16-token pages) holds every curated metric, the instruction
    counts among them: all pipes' warp instructions, of them the load/store pipe's and the tensor pipe's."""
    ks = ncu.parse_csv((FIX / "ncu_raw_h200_case15_p16_real.csv").read_text())
    assert [k.name for k in ks] == ["decode_balanced_kernel"]
    m = ks[0].metrics
    assert set(ncu.METRICS) - set(m) == set()
    assert m["grid_size"] == 392 and m["inst_executed"] == pytest.approx(15191864)
    assert 0 < m["tensor_inst"] < m["lsu_inst"] < m["inst_executed"]


def test_parse_ncu_details_page():
    text = ('"ID","Kernel Name","Block Size","Grid Size","Section Name","Metric Name","Metric Unit","Metric Value"\n'
            '"0","k","(128, 1, 1)","(8, 2, 1)","Command line profiler '
            'metrics","gpu__time_duration.sum","msecond","0.02"\n'
            '"0","k","(128, 1, 1)","(8, 2, 1)","Command line profiler metrics","dram__bytes.sum","Kbyte","2.5"\n')
    (k,) = ncu.parse_csv(text)
    assert k.metrics["duration_ns"] == pytest.approx(20000) and k.metrics["dram_bytes"] == pytest.approx(2500)
    assert k.metrics["grid_size"] == 16 and k.metrics["block_size"] == 128      # from the Grid/Block columns


def test_parse_ncu_csv_rejects_garbage():
    with pytest.raises(ProfileError, match="no header row"):
        ncu.parse_csv("==ERROR== something broke\n")


def test_parse_mcprofiler_report():
    k = metax.parse_report(json.loads((FIX / "mcprofiler_report_synthetic.txt.json").read_text()), "decode")
    m = k.metrics
    assert m["tensor_pct"] == 2.5 and m["l2_hit_pct"] == 12.5 and m["dispatched_waves"] == 64
    assert m["dram_read_bytes"] == 16781312 and m["dram_write_bytes"] == 8000 and m["dram_bytes"] == 16789312
    assert m["isu_stall_dnoc_wait"] == 5200 and "ipc" in m
    assert "smem_conflict_cycles" in m and "wave_life_cycles" in k.missing
    assert metax.parse_value("1,024 byte") == 1024 and metax.parse_value("n/a") is None


def test_mctracer_kernels():
    from kopt.profile.trace import load_trace

    ks = metax.tracer_kernels(load_trace(FIX / "mctracer_synthetic.json"))
    assert [k.name for k in ks] == ["decode_split_kernel", "combine_kernel"]
    m = ks[0].metrics
    assert m["grid_size"] == 64 and m["block_size"] == 128 and m["duration_ns"] == 9000
    assert m["registers_per_thread"] == 96 and m["smem_dynamic_bytes"] == 40960
    assert m["theoretical_occupancy_pct"] == 25.0          # min of the mtreg / shared-memory bounds


def test_unverified_metax_is_labelled():
    assert "UNVERIFIED" in metax.__doc__
    assert os.path.basename(metax.__file__) == "metax.py"


FAKE_METAX = r'''#!{py}
import os, shutil, sys
a, fix = sys.argv[1:], os.environ["FAKE_FIX"]
if os.path.basename(sys.argv[0]) == "mcTracer":
    d = a[a.index("--odname") + 1]
    os.makedirs(d, exist_ok=True)
    shutil.copy(os.path.join(fix, "mctracer_synthetic.json"), os.path.join(d, "tracer_out-4242.json"))
    sys.exit(0)
os.makedirs("prof_out/kernels", exist_ok=True)
shutil.copy(os.path.join(fix, "mcprofiler_report_synthetic.txt.json"),
            "prof_out/kernels/kopt_case10_decode_split_kernel.txt.json")
print("[info] output path is: prof_out")
'''


def test_metax_adapters_with_fake_tools(tmp_path, monkeypatch):
    """mcProfiler + mcTracer adapters end to end on fake executables; counters merge into the launches."""
    from kopt.profile import diagnosis as dg
    from kopt.profile.runner import _merge_metax
    from kopt.profile.trace import load_trace

    tools = tmp_path / "bin"
    tools.mkdir()
    for name in ("mcProfiler", "mcTracer"):
        p = tools / name
        p.write_text(FAKE_METAX.replace("{py}", sys.executable))
        p.chmod(p.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("FAKE_FIX", str(FIX))
    out = tmp_path / "o"
    out.mkdir()
    counters, files, _ = metax.run_mcprofiler(str(tools / "mcProfiler"), out, TARGET, "kopt_case10")
    assert "mcprofiler_config.json" in files and any(f.endswith(".txt.json") for f in files)
    assert counters[0].metrics["tensor_pct"] == 2.5
    trace, _ = metax.run_mctracer(str(tools / "mcTracer"), out, TARGET)
    assert trace.name == "tracer_out-4242.json" and trace.parent == out / "mctracer"
    merged = _merge_metax(counters, metax.tracer_kernels(load_trace(trace)))
    split = merged[0]
    assert (split.name == "decode_split_kernel" and split.metrics["grid_size"] == 64
            and split.metrics["tensor_pct"] == 2.5)
    d = dg.diagnose(dg.Evidence(kernels=merged, units=104, unit_name="AP", vendor="metax"))
    dims = {x.key: x for x in d.dimensions}
    assert dims["occupancy"].score.value == "limiting" and "104 APs" in dims["occupancy"].reason
    assert "approximate" in dims["stalls"].reason and dims["tensor"].score.value != "NA"
