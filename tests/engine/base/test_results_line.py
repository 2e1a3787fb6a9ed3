"""The machine line grammar, parsed by a regex independent of kopt's own parser."""

import re

import pytest

from kopt.records import CaseResult, Status, TimingStats, machine_line, parse_line

GRAMMAR = re.compile(
    r"^COMPILED:(?P<compiled>True|False) CORRECT:(?P<correct>True|False) BACKEND:(?P<backend>\S+) "
    r"RUNTIME:(?P<rt>NA|\d+\.\d{4}) REF_RUNTIME:(?P<ref>NA|\d+\.\d{4}) SPEEDUP:(?P<sp>NA|\d+\.\d{4}x) "
    r"CASE:(?P<case>\d+) DEVICE:(?P<device>\S+) REF:(?P<refname>\S+) STATUS:(?P<status>[a-z_]+)"
    r"(?: [A-Z_]+:\S+)*$")


def _row(**kw):
    base = dict(row_id="r1", case=10, backend="tilelang", compiled=True, correct=True, runtime_ms=0.0623,
                ref_runtime_ms=0.0618, speedup=0.0618 / 0.0623, device="H200", ref="flash_attn-2.8.3")
    return CaseResult(**{**base, **kw})


def test_seed_fields_first_in_order():
    line = machine_line(_row())
    m = GRAMMAR.match(line)
    assert m, line
    assert line.startswith("COMPILED:True CORRECT:True BACKEND:tilelang RUNTIME:0.0623 REF_RUNTIME:0.0618 "
                           "SPEEDUP:0.9920x ")
    assert m["case"] == "10" and m["refname"] == "flash_attn-2.8.3" and m["status"] == "ok"
    assert "\n" not in line


def test_speedup_from_unrounded_values():
    r = _row(runtime_ms=0.06234, ref_runtime_ms=0.06176, speedup=0.06176 / 0.06234)
    assert parse_line(machine_line(r))["SPEEDUP"] == f"{0.06176 / 0.06234:.4f}x"


def test_not_measured_is_NA():
    line = machine_line(_row(compiled=False, correct=False, runtime_ms=None, ref_runtime_ms=None, speedup=None,
                             status=Status.compile_error, device="cpu", ref="NA"))
    m = GRAMMAR.match(line)
    assert m and m["rt"] == "NA" and m["sp"] == "NA" and m["status"] == "compile_error"
    assert "-1" not in line


def test_extras_and_tokens_without_spaces():
    t = TimingStats(method="cupti", median_ms=0.06, q1_ms=0.059, q3_ms=0.061, min_ms=0.058, n=200, rel_iqr=0.03,
                    noisy=False)
    line = machine_line(_row(timing=t, speedup_ci=(0.98, 1.01), device="NVIDIA H200 NVL", gbps=3500.0, pct_peak=82.1))
    f = parse_line(line)
    assert f["DEVICE"] == "NVIDIA_H200_NVL" and f["SPEEDUP_CI"] == "0.9800-1.0100" and f["NOISY"] == "0"
    assert f["GBPS"] == "3500.0" and f["PCT_PEAK"] == "82.1"
    assert GRAMMAR.match(line)


def test_parse_rejects_garbage():
    with pytest.raises(ValueError):
        parse_line("CORRECT:True COMPILED:True")


def test_replay_field_and_the_note_on_stderr():
    from kopt.cli.output import replay_note

    t = TimingStats(method="cupti", median_ms=0.01, q1_ms=0.009, q3_ms=0.011, min_ms=0.009, n=100, rel_iqr=0.2,
                    device_only=True, replay="graph")
    assert parse_line(machine_line(_row(timing=t)))["REPLAY"] == "graph" and replay_note(_row(timing=t)) == ""
    s = t.model_copy(update={"replay": "stream", "replay_note": "candidate: not capturable as a CUDA graph (x)"})
    assert parse_line(machine_line(_row(timing=s)))["REPLAY"] == "stream"
    assert replay_note(_row(timing=s)) == ("timed on the stream, not as graph replays: candidate: not capturable "
                                           "as a CUDA graph (x)")
    assert parse_line(machine_line(_row()))["REPLAY"] == "NA"          # no timing (the CPU path, a failure)
