"""`kopt lab`: the research tools' pure parts, their usage errors (one line, exit 2, before any GPU work), the
prewarm list on the CPU, the export, and a campaign of a few steps run for real. What needs a GPU (the screens,
timelines, read bounds, compiles and the FlashInfer check) is checked here as far as argument parsing and plans go."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, SHIPPED, assert_clean, run_main

ROW = ('{"schema_version":1,"row_id":"r1","run_id":"x","mode":"signal","kind":"case","candidate_id":"aaaaaaaaaaaa",'
       '"case":1,"device":"cpu","status":"ok","compiled":true,"correct":true}')


#: The GPU tools whose usage errors are checked with the shipped candidate (the test workspace holds none).
WITH_CANDIDATE = ("screen", "timeline", "readbound", "prewarm")


def refused(argv: list[str], needle: str) -> str:
    """`kopt argv` exits 2 with one `kopt: error:` line holding `needle`, and writes nothing to stdout."""
    if argv[:2] in (["lab", c] for c in WITH_CANDIDATE) and "--candidate" not in argv:
        argv = [*argv, "--candidate", str(SHIPPED)]
    code, out, err = run_main(argv)
    assert_clean(code, out, err, allowed=(2,))
    assert needle in err and out == "", (err, out)
    return err


def test_the_lab_face_names_what_it_holds():
    import kopt.lab

    assert all(getattr(kopt.lab, name) is not None for name in kopt.lab.__all__)
    with pytest.raises(AttributeError):
        kopt.lab.no_such_name  # noqa: B018


# ---------------------------------------------------------------- configs (pure)

def test_configs_parse_labels_and_overlays():
    from kopt.lab import LabConfig, parse_configs

    assert parse_configs('a={"pdl": 0}; b=+{"block_N": 128} ;') == [LabConfig("a", {"pdl": 0}, False),
                                                                    LabConfig("b", {"block_N": 128}, True)]
    assert parse_configs('{"pdl": 0};+{"fused": 1}', labelled=False) == [LabConfig("c0", {"pdl": 0}, False),
                                                                        LabConfig("c1", {"fused": 1}, True)]
    assert LabConfig("b", {"pdl": 0}, True).full({"pdl": 1, "block_N": 64}) == {"pdl": 0, "block_N": 64}
    assert LabConfig("a", {"pdl": 0}, False).full({"pdl": 1, "block_N": 64}) == {"pdl": 0}


@pytest.mark.parametrize("text", ['{"pdl": 0}', "=[]", "x=[1]", "x={bad"])
def test_a_bad_config_is_a_usage_error(text):
    from kopt.errors import UsageError
    from kopt.lab import parse_configs

    with pytest.raises(UsageError):
        parse_configs(text)


def test_resolved_config_is_the_plan_as_config_keys():
    """What '+{..}' is laid over: booleans as 0/1, the call's own fields (path, paged, page_size) and any field that
    is no config key of the candidate left out; a config resolving to the default plan is an A/A (same_plan)."""
    from kopt.lab import resolved_config, same_plan

    plan = {"path": "cuda", "paged": False, "page_size": 0, "block_N": 128, "pdl": True, "fused": False, "scale": 0.1}
    assert resolved_config(plan, frozenset({"block_N", "pdl", "fused"})) == {"block_N": 128, "pdl": 1, "fused": 0}
    assert resolved_config(plan) == {"block_N": 128, "pdl": 1, "fused": 0, "scale": 0.1}
    assert same_plan(dict(plan), plan) and not same_plan(plan | {"pdl": False}, plan)


def test_an_overlay_keeps_as_much_of_the_plan_as_the_candidate_accepts():
    """fit_over with a toy candidate: a balanced plan may not pin a split count, so an overlay drops the plan's
    num_splits and keeps the rest; a switch the candidate refuses whatever is dropped stays whole (its error is
    reported); an overlay the candidate takes is not touched."""
    from kopt.lab import LabConfig
    from kopt.lab.configs import fit_over

    def plan_of(cfg):
        if cfg.get("balanced") and "num_splits" in cfg or cfg.get("per_sm") and not cfg.get("balanced"):
            return None
        return {"block_N": cfg.get("block_N", 64), "num_splits": cfg.get("num_splits", 9),
                "balanced": cfg.get("balanced", 0), "threads": cfg.get("threads", 128)}

    plan = {"block_N": 64, "num_splits": 4, "balanced": 0, "threads": 64}
    assert fit_over(plan, {"balanced": 1}, plan_of) == {"block_N": 64, "balanced": 1, "threads": 64}
    assert fit_over(plan, {"block_N": 128}, plan_of) == plan | {"block_N": 128}
    assert fit_over(plan, {"per_sm": 2}, plan_of) == plan | {"per_sm": 2}
    assert LabConfig("b", {"balanced": 1}, True).full(plan, plan_of) == {"block_N": 64, "balanced": 1, "threads": 64}


def test_overlays_on_the_shipped_candidate_resolve_on_every_plan_class():
    """The shipped candidate refuses a key a plan cannot use (num_splits on a balanced plan, last_cta on an unsplit
    one), and its plans report every field: each overlay still resolves where the switch applies (H100 profile,
    through device_plan: no GPU), and a switch the plan cannot take stays refused."""
    from kopt import candidate, hardware
    from kopt.lab import parse_configs, pick_cases, resolved_config
    from kopt.lab.common import plan_oracle

    mod = candidate.load(SHIPPED)
    prof = hardware.profile("H100")
    prof = prof.model_dump() if hasattr(prof, "model_dump") else prof
    bn, bal, bps = parse_configs('bn=+{"block_N": 128};bal=+{"balanced": 1};bps=+{"bal_per_sm": 1}')
    seen = set()
    for case in pick_cases("1002,1006,1011", heldout=12, seed=20261207):  # balanced, direct, split + combine
        plan_of = plan_oracle(mod, case, prof)
        own = resolved_config(plan_of({}), candidate.config_keys(SHIPPED))
        seen.add(plan_of({})["kernel"])
        assert plan_of(bn.full(own, plan_of))["block_N"] == 128
        assert plan_of(bal.full(own, plan_of))["kernel"] == "decode_balanced"
        if not own["balanced"]:
            assert plan_of(bps.full(own, plan_of)) is None
    assert seen == {"decode_balanced", "decode_direct", "decode_split_combine"}


def test_screen_watchdog_reports_a_hang_and_exits_3():
    """A config with no result in time (a hanging kernel blocks the process in a CUDA wait) is printed as HUNG and
    the process exits 3, so the next screen still runs; a cancelled watchdog does nothing."""
    code = ("import time; from kopt.lab.screen import watchdog; d = watchdog({s}, 'case=10 config=x HUNG'); "
            "{then}; time.sleep(1.5); print('done')")
    env = {"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"}
    p = subprocess.run([sys.executable, "-c", code.format(s=0.2, then="pass")], capture_output=True, text=True,
                       timeout=60, env=env)
    assert p.returncode == 3 and p.stdout.strip() == "case=10 config=x HUNG"
    p = subprocess.run([sys.executable, "-c", code.format(s=0.5, then="d.cancel()")], capture_output=True, text=True,
                       timeout=60, env=env)
    assert p.returncode == 0 and p.stdout.strip() == "done"


def test_timeline_summary_takes_medians_per_kernel_and_the_handoff():
    from kopt.lab.timeline import summarize

    calls = [[("split", 0.0, 6.0), ("combine", 6.5, 8.0)], [("split", 0.0, 6.4), ("combine", 6.9, 8.6)],
             [("split", 0.0, 6.2), ("combine", 6.6, 8.1)]]
    rows, nums = summarize("10 candidate", calls, 1)
    assert nums == {"span_us": 8.1, "missing": 1, "handoff_us": pytest.approx(2.0)}  # 2.0, 2.2, 1.9
    assert rows[0] == "| 10 candidate | 0: `split` | 0.00 | 6.20 | 6.20 |" and len(rows) == 2
    rows, nums = summarize("x", calls + [[("split", 0.0, 5.0)]], 0)
    assert nums == {} and "NA: the calls launched different kernel counts ([1, 2])" in rows[0]


def test_readbound_says_why_a_case_has_no_shaped_read_and_takes_the_perf_geomean():
    from kopt.cases import load_cases, select
    from kopt.lab.readbound import shaped_na, table

    uniform, ragged = select(load_cases(), [10, 18])
    assert shaped_na(uniform, {"paged": False, "balanced": 0}) is None
    assert shaped_na(uniform, {"paged": True}) == "NA: a paged cache"
    assert shaped_na(uniform, {"balanced": 1}).startswith("NA: a balanced plan")
    assert shaped_na(ragged, {"paged": False, "balanced": 0}).startswith("NA: ragged lengths")
    row = dict(case=1, kind="perf", bytes=2e6, limit_us=1.0, read_us=2.0, cand_us=4.0, read_pct=50.0, cand_pct=25.0,
               ratio=2.0, lo=1.9, hi=2.1, shaped_us=None, hm_us=None)
    lines = table([row, row | {"case": 2, "read_pct": 200.0, "cand_pct": 100.0}], emit=lambda s: None)
    assert "| 1 | NA | 2.00 | 1.00 | 2.00 | NA | NA | 4.00 | 50.0 | 25.0 | 2.000 (1.900-2.100) |" in lines
    assert lines[-1].startswith("geomean over 2 perf cases: read % of limit 100.0, candidate % of limit 50.0")
    held = [row | {"case": 1001, "kind": "heldout", "read_pct": 80.0, "cand_pct": 40.0},
            row | {"case": 1002, "kind": "heldout", "read_pct": 45.0, "cand_pct": 10.0}]
    held = [h | {"plan": cls} for h, cls in zip(held, ("direct floor", "balanced"))]
    lines = table([row] + held, emit=lambda s: None)
    assert lines[-8].startswith("geomean over 1 perf cases: read % of limit 50.0")
    assert lines[-6].startswith("geomean over 2 held-out draws: read % of limit 60.0, candidate % of limit 20.0")
    # per plan class: its draws' geomeans, and all draws' geomean with that class alone at its read
    assert lines[-2] == "| balanced | 1 | 45.0 | 10.0 | 2.000 | 42.4 |"  # sqrt(40 x 45)
    assert lines[-1] == "| direct floor | 1 | 80.0 | 40.0 | 2.000 | 28.3 |"  # sqrt(80 x 10)
    # a NA plan-shaped read says why, under the table, with its cases
    na = [row | {"case": c, "shaped_how": shaped_na(ragged if c == 3 else uniform, plan)}
          for c, plan in ((1, {"paged": True}), (2, {"paged": True}), (3, {"paged": False, "balanced": 0}))]
    lines = table(na + [row | {"case": 4, "shaped_us": 3.0, "hm_us": 3.5, "shaped_how": "triton 4 warps"}],
                  emit=lambda s: None)
    assert lines[lines.index("") + 1] == ("plan-shaped reads NA: a paged cache (1, 2); ragged lengths (the shaped read "
                                          "reads the allocated length) (3)")
    assert "| 4 | NA | 2.00 | 1.00 | 2.00 | 3.00 | 3.50 | 4.00 | 50.0 | 25.0 | 2.000 (1.900-2.100) |" in lines


def test_a_plan_class_is_its_kernel_and_the_floor():
    from kopt.policy.ranking import plan_class

    assert plan_class({"kernel": "decode_split_combine", "block_N": 64}, True) == "split_combine floor"
    assert plan_class({"kernel": "decode_balanced"}, False) == "balanced"
    assert plan_class({"path": "c-target"}, False) == "c-target"
    assert plan_class(None, False) == "NA"  # a row of an older schema without a plan


def test_lab_cases_keep_their_own_layout_unless_a_page_size_is_given():
    from kopt.lab import pick_cases

    seed20 = pick_cases("20")[0]
    assert seed20.variant.page_size == 256 and seed20.variant.head_dim == 64  # the seed case's own variant
    assert pick_cases("20", page_size=0)[0].variant.page_size is None
    assert pick_cases("10", page_size=16)[0].variant.page_size == 16
    draws = pick_cases("4,1001-1003", heldout=12, seed=20261206)
    assert [c.id for c in draws] == [4, 1001, 1002, 1003] and {c.kind for c in draws[1:]} == {"heldout"}
    from kopt.workloads import draw, load

    assert [c.batch for c in draws[1:]] == [c.batch for c in draw(load(), 12, 20261206)[:3]]


# ---------------------------------------------------------------- usage errors, before any GPU work

@pytest.mark.parametrize("argv,needle", [
    (["lab", "screen", "--case", "10", "--configs", "nolabel"], "config 'nolabel': want label=JSON"),
    (["lab", "screen", "--case", "10", "--configs", 'x={"no_such_key": 1}'], "unknown key no_such_key"),
    (["lab", "screen", "--case", "99", "--configs", "x={}"], "unknown case id 99"),
    (["lab", "screen", "--case", "10", "--configs", "x={}", "--page-size", "48"], "--page-size must be"),
    (["lab", "timeline", "--calls", "5"], "--calls must be at least 20, got 5"),
    (["lab", "timeline", "--configs", "nolabel"], "config 'nolabel': want label=JSON"),
    (["lab", "readbound", "--layouts", "0,17"], "--layouts takes page sizes"),
    (["lab", "readbound", "--candidate", "nope.py"], "candidate file not found"),
    (["lab", "readbound", "--heldout", "3"], "--heldout goes with --heldout-seed"),
    (["lab", "screen", "--case", "1002", "--configs", "x={}"], "case 1002 is a held-out draw"),
    (["lab", "screen", "--case", "10", "--configs", "x={}", "--heldout", "3"], "--heldout goes with --heldout-seed"),
    (["lab", "timeline", "--case", "1013", "--heldout-seed", "7"], "case 1013 is not in a draw of 12"),
    (["lab", "readbound", "--case", "1003"], "case 1003 is a held-out draw: give the verdict's --heldout-seed"),
    (["lab", "readbound", "--heldout-seed", "5", "--heldout", "2", "--case", "1003"], "is not in a draw of 2"),
    (["lab", "prewarm", "--bf16"], "--bf16 goes with --verify"),
    (["lab", "prewarm", "--heldout", "3", "--verify"], "--heldout goes with --heldout-seed"),
    (["lab", "prewarm", "--verify", "--case", "10"], "--verify and --case are exclusive"),
    (["lab", "prewarm", "--page-size", "16"], "--page-size goes with --case"),
    (["lab", "prewarm", "--list", "--device-profile", "NOPE"], "no such GPU profile"),
    (["lab", "prewarm", "--device-profile", "C500", "--case", "4"], "compiling with no GPU is for NVIDIA devices"),
    (["lab", "prewarm", "--list", "--device-profile", "H200", "--configs", "[1]"], "want a JSON object"),
    (["lab", "export", "nope"], "ledger not found"),
    (["lab", "campaign", "nope.yaml"], "campaign file not found"),
    (["lab", "campaign", "--steps", "", "x.yaml"], "--steps names no step"),
    (["lab", "flashinfer-build", "--src", "nope.tar.xz"], "--src nope.tar.xz: no such file"),
    (["lab", "flashinfer-build", "--wheel", "pyproject.toml", "--src", "pyproject.toml"], "--wheel or --src, not both"),
])
def test_lab_usage_errors_are_one_line_exit_2(argv, needle):
    refused(argv, needle)


@pytest.mark.parametrize("argv", [["lab", "screen", "--case", "10", "--configs", "x={}"], ["lab", "timeline"],
                                  ["lab", "readbound"], ["lab", "prewarm"], ["lab", "prewarm", "--list"],
                                  ["lab", "flashinfer"]])
def test_gpu_tools_say_in_one_line_that_they_need_a_gpu(argv):
    from kopt import hardware

    if hardware.cuda_missing("x") is None:
        pytest.skip("a CUDA device is visible here")
    refused(argv, "needs a CUDA device; none is visible")


@pytest.mark.parametrize("sub", ["screen", "timeline", "readbound", "prewarm", "export", "flashinfer",
                                 "flashinfer-build", "campaign"])
def test_every_lab_command_has_help(sub):
    code, out, err = run_main(["lab", sub, "--help"])
    assert code == 0 and "Usage" in out, err


# ---------------------------------------------------------------- prewarm: the list, on any machine

def test_prewarm_lists_distinct_kernels_of_a_device_profile_on_the_cpu():
    """--list with a device profile resolves every shape's plan through the candidate's device_plan, here: the
    verify set is a subset of the default set's kernels, a '+{..}' config laid over case 10's plan adds its kernel
    (the same fields but the switch), and every line names the call's dtype and heads."""
    def listed(*args):
        code, out, err = run_main(["lab", "prewarm", "--list", "--device-profile", "H200", "--candidate", str(SHIPPED),
                                   *args])
        assert code == 0, err
        *lines, last = out.splitlines()
        assert last == f"{len(lines)} kernels" and len(set(lines)) == len(lines)
        return lines

    default, verify = listed(), listed("--verify")
    assert set(verify) <= set(default) and len(verify) < len(default)
    assert all(x.startswith("dtype=") and " hq=" in x and " split=" in x and "FAILED" not in x for x in default)
    own = listed("--case", "10")
    over = listed("--case", "10", "--configs", '+{"red_batch": 1}')
    assert len(own) == 1 and len(over) == 2 and own[0] in over
    (other,) = [x for x in over if x != own[0]]
    differ = set(other.split()) ^ set(own[0].split())
    assert {w.split("=")[0] for w in differ} == {"red_batch"}, differ


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_prewarm_compiles_a_device_profiles_kernels_with_no_gpu(tmp_path, monkeypatch):
    """--device-profile without --list builds an H200's kernels on this GPU-less host: the candidate's build_plan
    (TileLang's lowering and nvcc, no CUDA context) in workers forked from one that imported torch and TileLang,
    into TileLang's disk cache (here a fresh one), one cubin a kernel."""
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path / "cache"))
    argv = ["lab", "prewarm", "--device-profile", "H200", "--case", "4,5", "--jobs", "2", "--candidate", str(SHIPPED)]
    code, out, err = run_main(argv)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[-1].startswith("prewarm: 2/2 kernels in ") and len(lines) == 3, out
    cubins = sorted((tmp_path / "cache").rglob("*.cubin"))
    assert len(cubins) == 2 and all(c.stat().st_size > 10_000 for c in cubins), cubins


def test_prewarm_with_a_profile_needs_the_build_plan_hook(tmp_path):
    """A candidate without build_plan cannot compile with no GPU: one line, exit 2, before anything compiles. (A
    candidate of its own, with no sibling modules: a copy of the shipped folder would leave its modules, and their
    tuning table, in this process for the tests after it.)"""
    cand = tmp_path / "run_kernel.py"
    cand.write_text("def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None, config=None):\n"
                    "    return q\n\n\ndef device_plan(case, device, config=None):\n    return {}\n\n\n"
                    "def prepare(*args, **kwargs):\n    return None\n\n\ndef configs(case):\n    return [{}]\n")
    refused(["lab", "prewarm", "--device-profile", "H200", "--case", "4", "--candidate", str(cand)],
            "which this candidate lacks")


def test_prewarm_build_error_comes_back_as_text():
    """A worker's failure is returned as one line (a compiler's exception may not survive the trip back, and the
    pool would lose its worker), so the other kernels still compile."""
    from kopt.cases import load_cases
    from kopt.eval.prewarm import compile_kernel

    case = load_cases()[0]
    seconds, err = compile_kernel("no/such/run_kernel.py", case.model_dump_json(), None)
    assert seconds >= 0 and err and len(err) <= 300 and "\n" not in err


# ---------------------------------------------------------------- export

def _bench_rows(run_id, runtime, cases, ref=0.010, replay="graph", variant="fp16-d128-contig-full"):
    return [json.dumps({"mode": "signal", "candidate_id": "abcdef012345", "run_id": run_id, "case": c,
                        "variant": variant, "runtime_ms": runtime(c), "ref_runtime_ms": ref, "commit": "deadbee",
                        "timestamp": "2026-12-01T11:31:00+00:00", "device": "H200", "kind": "case", "status": "ok",
                        "correct": True, "case_kind": "ragged" if c >= 15 else "perf",
                        "timing": {"method": "cupti", "replay": replay, "flush_kind": "read", "n": 5004}})
            for c in cases]


def test_export_writes_the_replay_column(workspace):
    (workspace / "candidates.jsonl").write_text("\n".join(_bench_rows("runA", lambda c: 0.0031, [1, 2],
                                                                      replay="stream")) + "\n")
    code, out, err = run_main(["lab", "export", "runA"])
    assert code == 0, err
    head, first, *_ = out.splitlines()
    cols = head.split(",")
    assert first.split(",")[cols.index("replay")] == "stream" and first.split(",")[cols.index("case")] == "1"
    refused(["lab", "export", "runA", "runB"], "no case rows for run id(s) runB")
    refused(["lab", "export", "runA,runB"], "no case rows for run id(s) runB")  # a comma list, as --case takes


def test_export_takes_a_comma_list_of_runs(workspace):
    (workspace / "candidates.jsonl").write_text("\n".join(_bench_rows("runA", lambda c: 0.0031, [1])
                                                          + _bench_rows("runB", lambda c: 0.0032, [2])) + "\n")
    code, out, err = run_main(["lab", "export", "runA,runB"])
    assert code == 0, err
    assert len(out.splitlines()) == 3, out   # the header and one row of each run


def test_export_markdown_holds_each_layout_against_contiguous(workspace):
    """--markdown: a case's paged runtimes beside its contiguous one, and per page size the ragged cases over the 5%
    bar (R4 at +6% in 16-token pages), or that every one is within it."""
    lines = _bench_rows("runC", lambda c: 0.040, [10, 15, 16, 17, 18])
    for run, page, slower in (("runP16", 16, {18: 1.06}), ("runP256", 256, {})):
        lines += _bench_rows(run, lambda c, s=slower: 0.040 * s.get(c, 1.01), [15, 16, 17, 18],
                             variant=f"fp16-d128-paged{page}-full")
    (workspace / "candidates.jsonl").write_text("\n".join(lines) + "\n")
    out_file = workspace / "table.md"
    code, out, err = run_main(["lab", "export", "runC", "runP16", "runP256", "--markdown", "--out", str(out_file)])
    assert code == 0 and out == "", err
    text = out_file.read_text()
    assert "| R4 | 40.00 | 10.00 |" in text and "42.40 (+6.0%) | 40.40 (+1.0%) |" in text
    assert "| 10 | 40.00 |" in text and "16-token pages: over the 5% bar: R4 +6.0%" in text
    assert "256-token pages: every ragged case (4) within 5% of contiguous" in text
