"""`kopt trace summarize` on real kineto traces (CPU, H200) and a synthetic mcTracer trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kopt.cli.main import app
from kopt.profile.geometry import estimate_blocks_per_unit, prod, waves
from kopt.profile.trace import detect_format, load_trace, summarize, summarize_file

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "traces"
runner = CliRunner()


def test_cpu_kineto_trace_summarizes_top_level_ops():
    s = summarize_file(FIX / "kineto_cpu_case1_real.json")
    assert s.format == "kineto" and s.event_kind == "cpu ops" and s.time_unit == "us"
    assert s.kernels and s.kernels == sorted(s.kernels, key=lambda r: -r.total_us)
    assert sum(r.pct_busy for r in s.kernels) == pytest.approx(100.0)
    assert len(s.calls) == 3 and all(c.kernels > 0 for c in s.calls)
    assert s.gaps and s.gaps[0].n == s.n_events - 1
    assert any("no device kernels" in n for n in s.notes)


def test_cuda_kineto_trace_kernels_gaps_calls_and_tail():
    s = summarize_file(FIX / "kineto_cuda_h200_case10_real.json")
    assert s.event_kind == "device kernels" and s.units == 132 and s.device_name == "NVIDIA H200"
    names = [r.name for r in s.kernels]
    assert names == ["decode_split_kernel", "combine_kernel"]
    split = s.kernels[0]
    assert split.count == 3 and split.grid == [32, 4, 1] and split.registers == 140
    t = split.tail
    assert t["blocks"] == 128 and t["blocks_per_unit"] == 3 and "registers" in t["capacity_source"]
    assert t["waves"] == pytest.approx(128 / (132 * 3)) and t["idle_slot_pct"] == pytest.approx(100 * (1 - t["waves"]))
    assert len(s.calls) == 3 and all(c.kernels == 2 for c in s.calls)   # matched by launch correlation
    cs = s.call_stats()
    assert cs["kernels_per_call"] == 2 and 0 < cs["gap_pct"] < 100
    assert s.gaps[0].stream == "stream 7" and s.gaps[0].n == 5


def test_mctracer_synthetic_trace_in_ns():
    data = load_trace(FIX / "mctracer_synthetic.json")
    assert detect_format(data) == "mctracer"
    s = summarize(data, units=104, blocks_per_unit=2)
    assert s.time_unit == "ns" and any("UNVERIFIED" in n for n in s.notes)
    split = s.kernels[0]
    assert split.name == "decode_split_kernel" and split.mean_us == pytest.approx(9.0) and split.count == 3
    assert split.grid == [16, 4, 1] and split.registers == 96 and split.smem_bytes == 40960
    assert split.tail["waves"] == pytest.approx(64 / 208) and split.tail["capacity_source"] == "given"
    assert s.gaps[0].n == 5 and s.gaps[0].median_us == pytest.approx(2.0)   # 2 µs between split and combine
    assert summarize(data, time_unit="us").kernels[0].mean_us == pytest.approx(9000.0)


def test_truncated_mctracer_file_is_closed(tmp_path):
    text = (FIX / "mctracer_synthetic.json").read_text()
    body = json.dumps({"traceEvents": json.loads(text)["traceEvents"]})
    cut = body[: body.rindex("]}")] + ","     # an event array left open, as a stopped tracer leaves it
    f = tmp_path / "tracer_out-1.json"
    f.write_text(cut)
    assert summarize_file(f).kernels[0].count == 3


def test_bad_trace_is_a_usage_error(tmp_path):
    from kopt.errors import UsageError

    f = tmp_path / "x.json"
    f.write_text('{"foo": 1}')
    with pytest.raises(UsageError, match="no traceEvents"):
        summarize_file(f)


def test_geometry_helpers():
    assert prod([4, 2, 1]) == 8 and prod({"x": 3, "y": 2, "z": 1}) == 6 and prod("(128, 1, 1)") == 128
    props = {"warpSize": 32, "maxThreadsPerMultiprocessor": 2048, "regsPerMultiprocessor": 65536,
             "sharedMemPerMultiprocessor": 233472}
    assert estimate_blocks_per_unit(128, 140, 39936, props)[0] == 3
    w = waves(300, 132, 2)
    assert w.waves == pytest.approx(300 / 264) and w.full_waves == 1
    assert w.idle_slot_pct == pytest.approx(100 * (2 - 300 / 264) / 2)
    assert waves(264, 132, 2).last_wave_fraction == 1.0 and waves(100, 132, None).waves is None


def test_cli_summarize_json_and_table():
    r = runner.invoke(app, ["trace", "summarize", str(FIX / "kineto_cuda_h200_case10_real.json"), "--top", "1",
                            "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert len(d["kernels"]) == 1 and d["call_stats"]["calls"] == 3
    r = runner.invoke(app, ["trace", "summarize", str(FIX / "mctracer_synthetic.json"), "--device-profile", "C500"])
    assert r.exit_code == 0 and "decode_split_kernel" in r.stdout
    r = runner.invoke(app, ["trace", "summarize", str(FIX / "nope.json")])
    assert r.exit_code == 2
