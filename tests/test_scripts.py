"""The shell wrappers in scripts/ parse, are executable, and go through kopt (no logic of their own)."""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[1] / "scripts").glob("*.sh"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_script_parses_and_calls_kopt(script):
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    assert script.stat().st_mode & 0o111, f"{script.name} is not executable"
    assert "kopt" in script.read_text()


def test_campaign_skips_steps_past_its_budget(tmp_path):
    """With no budget left every step is skipped, and the archive is still written."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "h200_campaign.sh"
    p = subprocess.run(["bash", str(script), str(tmp_path / "out"), "doctor", "bench"], capture_output=True,
                       text=True, env={"PATH": "/usr/bin:/bin", "CAMPAIGN_BUDGET_S": "0"}, cwd=tmp_path)
    steps = (tmp_path / "out" / "logs" / "steps.txt").read_text()
    assert "doctor skipped (budget)" in steps and "bench_fp16 skipped (budget)" in steps
    assert (tmp_path / "out" / "campaign.tgz").exists(), p.stderr


def test_campaign_pack_leaves_the_archive_and_the_step_list(tmp_path):
    """CAMPAIGN_PACK=1: the output folder holds campaign.tgz and steps.txt only, and the archive has the logs."""
    import tarfile

    script = Path(__file__).resolve().parents[1] / "scripts" / "h200_campaign.sh"
    p = subprocess.run(["bash", str(script), str(tmp_path / "out"), "doctor"], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "CAMPAIGN_BUDGET_S": "0", "CAMPAIGN_PACK": "1"}, cwd=tmp_path)
    assert sorted(f.name for f in (tmp_path / "out").iterdir()) == ["campaign.tgz", "steps.txt"], p.stderr
    assert "doctor skipped (budget)" in (tmp_path / "out" / "steps.txt").read_text()
    with tarfile.open(tmp_path / "out" / "campaign.tgz") as t:
        assert "logs/steps.txt" in t.getnames()


def test_cfgscreen_takes_each_lines_own_args(tmp_path):
    """A screen file's third field holds that line's arguments (after CFG_SCREEN_ARGS, so its --page-size wins):
    each line compiles its configs for its own layout and screens with its own arguments. python3 is a stub here
    that records how it was called."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "h200_campaign.sh"
    stub = tmp_path / "bin"
    stub.mkdir()
    calls = tmp_path / "calls.txt"
    (stub / "python3").write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    (stub / "python3").chmod(0o755)
    screen = tmp_path / "screen.tsv"
    screen.write_text('# a comment\n15,16\tbt=+{"a": 1}\t--page-size 16\n'
                      '15\tbt=+{"a": 1}\n17\tx={"block_N": 64}\t--page-size 256 --quick\n')
    env = {"PATH": f"{stub}:/usr/bin:/bin", "CFG_SCREEN": str(screen), "CFG_SCREEN_ARGS": "--page-size 64"}
    p = subprocess.run(["bash", str(script), str(tmp_path / "out"), "cfgscreen"], capture_output=True, text=True,
                       env=env, cwd=tmp_path)
    lines = calls.read_text().splitlines()
    prewarm = [x for x in lines if "prewarm_kernels.py" in x]
    screens = [x for x in lines if "gpu_config_screen.py" in x]
    assert len(prewarm) == 3 and len(screens) == 3, p.stderr
    assert [x.split("--page-size ")[-1].split()[0] for x in prewarm] == ["16", "64", "256"]
    assert screens[0].endswith("--page-size 64 --page-size 16") and screens[1].endswith("--page-size 64")
    assert screens[2].endswith("--page-size 64 --page-size 256 --quick") and "--cases 17" in screens[2]
    steps = (tmp_path / "out" / "logs" / "steps.txt").read_text()
    assert "cfgscreen_0 cases=15,16" in steps and "args=--page-size 16" in steps and "cfgscreen_2 cases=17" in steps


def test_kerneltests_summary_counts_the_tests_no_shard_reached(tmp_path):
    """kerneltests: the summary counts each outcome over the shards and, from one --collect-only of the same
    selection, the selected tests no shard reported (cut by the budget); NA with the reason when the selection
    cannot be counted; kerneltests_left.txt lists the ones not reached, and KERNELTESTS_NODES runs just those. python3
    is a stub: 5 tests selected, shard 0 reports two, shard 1 one, both then stop."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "h200_campaign.sh"
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "python3").write_text(
        '#!/bin/sh\ncase "$*" in\n'
        '  *collect-only*) echo "$*" >> calls.txt; [ -n "$NO_COUNT" ] && exit 0\n'
        '    for t in a[1] a[2] a[3] b[1] b[2]; do echo "tests/test_kernel_gpu.py::$t"; done\n'
        '    echo "5/343 tests collected (338 deselected) in 1.00s" ;;\n'
        '  *pytest_timeout*) exit 1 ;;\n'
        '  *test_kernel_gpu.py*) if [ "$KOPT_TEST_SHARD" = "0/2" ]; then\n'
        '      echo "tests/test_kernel_gpu.py::a[1] PASSED [ 20%]"\n'
        '      echo "tests/test_kernel_gpu.py::a[2] FAILED [ 40%]"\n'
        '    else echo "tests/test_kernel_gpu.py::b[1] PASSED [ 60%]"; fi ;;\n'
        'esac\n')
    (stub / "python3").chmod(0o755)
    for extra, want in (({}, "2 NOT_REACHED (of 5 selected)"),
                        ({"NO_COUNT": "1"}, "NA NOT_REACHED: the selection could not be counted")):
        out = tmp_path / f"out{len(extra)}"
        env = {"PATH": f"{stub}:/usr/bin:/bin", "KERNELTESTS_SHARDS": "2", "KERNELTESTS_K": "a or b"} | extra
        p = subprocess.run(["bash", str(script), str(out), "kerneltests"], capture_output=True, text=True, env=env,
                           cwd=tmp_path)
        summary = (out / "logs" / "kerneltests_summary.txt").read_text()
        assert "2 PASSED" in summary and "1 FAILED" in summary and want in summary, (summary, p.stderr)
    # the node ids no shard reached, and a second run of just those (KERNELTESTS_NODES); an empty list runs nothing
    left = (tmp_path / "out0" / "logs" / "kerneltests_left.txt").read_text().split()
    assert left == ["tests/test_kernel_gpu.py::a[3]", "tests/test_kernel_gpu.py::b[2]"]
    (tmp_path / "left.txt").write_text("\n".join(left) + "\n\n")
    (tmp_path / "calls.txt").unlink()
    env = {"PATH": f"{stub}:/usr/bin:/bin", "KERNELTESTS_SHARDS": "2", "KERNELTESTS_NODES": "left.txt"}
    subprocess.run(["bash", str(script), str(tmp_path / "again"), "kerneltests"], env=env, cwd=tmp_path, check=True)
    call = (tmp_path / "calls.txt").read_text()
    assert call.rstrip().endswith("tests/test_kernel_gpu.py::a[3] tests/test_kernel_gpu.py::b[2]"), call
    (tmp_path / "empty.txt").write_text("\n")
    p = subprocess.run(["bash", str(script), str(tmp_path / "none"), "kerneltests"], capture_output=True, text=True,
                       env=env | {"KERNELTESTS_NODES": "empty.txt"}, cwd=tmp_path)
    assert "names no test" in p.stderr and not (tmp_path / "none" / "logs" / "kerneltests_summary.txt").exists()


ROOT = Path(__file__).resolve().parents[1]


def _script(name):
    """A script of scripts/ as a module (its pure helpers; the GPU parts are never called)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _bench_rows(run_id, runtime, ref=0.010, cases=None, replay="graph"):
    import json

    from kopt.cases import load_cases

    label = {c.id: c.variant.label() for c in load_cases(ROOT / "bench" / "cases.yaml")}
    return [json.dumps({"mode": "signal", "candidate_id": "abcdef012345", "run_id": run_id, "case": c,
                        "variant": label[c], "runtime_ms": runtime(c), "ref_runtime_ms": ref,
                        "commit": "deadbee", "timestamp": "2026-12-01T11:31:00+00:00", "device": "H200",
                        "kind": "case", "status": "ok", "correct": True,
                        "timing": {"method": "cupti", "replay": replay, "flush_kind": "read", "n": 5004}})
            for c in (cases or sorted(label))]


def test_bench_repeat_check_flags_the_case_a_run_moves(tmp_path):
    led = tmp_path / "candidates.jsonl"
    lines = []
    for i in range(5):  # case 16 moves by 5% in the last run; every other case by 0.1%
        lines += _bench_rows(f"run{i}", lambda c, i=i: 0.280 * (1.05 if c == 16 and i == 4 else 1 + 0.001 * i))
    led.write_text("\n".join(lines) + "\n")
    out = tmp_path / "repeat.md"
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_repeat_check.py"), "--candidate",
                        "abcdef012345", "--ledger", str(led), "--out", str(out)], capture_output=True, text=True)
    assert p.returncode == 1, p.stderr
    text = out.read_text()
    assert "| 16 |" in text and text.count("| no |") == 1 and "1 case(s) outside the bound" in text
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_repeat_check.py"), "--candidate",
                        "abcdef012345", "--ledger", str(led), "--runs", "6"], capture_output=True, text=True)
    assert p.returncode == 2 and "only 5 complete runs" in p.stderr


def test_graph_check_splits_calls_by_their_own_kernels():
    gc = _script("gpu_graph_check")
    gc.FLUSH_NAMES.update({"Memset", "reduce"})
    recs = [(0, 1, "Memset"), (1, 60, "reduce"), (61, 65, "split"), (65, 67, "combine"),
            (68, 69, "Memset"), (69, 120, "reduce"), (121, 124, "split"), (124, 125, "stray"),
            (125, 127, "combine")]
    spans, others = gc.call_runs(recs, {"split", "combine"})
    assert spans == [6 / 1e3, 3 / 1e3, 2 / 1e3] and others == {"stray"}   # a foreign record ends a run
    assert gc.record_name("Memset (Unknown)") == gc.record_name("Memset (Device)") == "Memset"
    assert gc.agree(0.01029, 0.01) and not gc.agree(0.0104, 0.01)        # 3% of 10 µs
    assert gc.agree(0.00329, 0.003) and not gc.agree(0.00331, 0.003)     # 0.3 µs on a 3 µs call


def test_export_bench_csv_writes_the_replay_column(tmp_path):
    led = tmp_path / "candidates.jsonl"
    led.write_text("\n".join(_bench_rows("runA", lambda c: 0.0031, cases=[1, 2], replay="stream")) + "\n")
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "export_bench_csv.py"), "runA", "--ledger", str(led)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    head, first, *_ = p.stdout.splitlines()
    cols = head.split(",")
    assert first.split(",")[cols.index("replay")] == "stream" and first.split(",")[cols.index("case")] == "1"


def test_export_bench_markdown_holds_each_layout_against_contiguous(tmp_path):
    """--markdown: a case's paged runtimes beside its contiguous one, and per page size the ragged cases over the 5%
    bar (R4 at +6% in 16-token pages), or that every one is within it."""
    import json

    led = tmp_path / "candidates.jsonl"
    def kind(row, variant="fp16-d128-contig-full"):  # the ledger's case_kind, as kopt writes it
        r = json.loads(row)
        return json.dumps(r | {"variant": variant, "case_kind": "ragged" if r["case"] >= 15 else "perf"})

    lines = [kind(x) for x in _bench_rows("runC", lambda c: 0.040, cases=[10, 15, 16, 17, 18])]
    for run, page, slower in (("runP16", 16, {18: 1.06}), ("runP256", 256, {})):
        for row in _bench_rows(run, lambda c, s=slower: 0.040 * s.get(c, 1.01), cases=[15, 16, 17, 18]):
            lines.append(kind(row, f"fp16-d128-paged{page}-full"))
    led.write_text("\n".join(lines) + "\n")
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "export_bench_csv.py"), "runC", "runP16", "runP256",
                        "--ledger", str(led), "--markdown"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "| R4 | 40.00 | 10.00 |" in out and "42.40 (+6.0%) | 40.40 (+1.0%) |" in out
    assert "| 10 | 40.00 |" in out and "16-token pages: over the 5% bar: R4 +6.0%" in out
    assert "256-token pages: every ragged case (4) within 5% of contiguous" in out


def test_config_screen_parses_labels_and_overlays():
    cs = _script("gpu_config_screen")
    got = cs.parse_configs('a={"pdl": 0}; b=+{"block_N": 128} ;')
    assert got == [("a", {"pdl": 0}, False), ("b", {"block_N": 128}, True)]
    for bad in ('{"pdl": 0}', '=[]', 'x=[1]', 'x={bad'):
        with pytest.raises(ValueError):
            cs.parse_configs(bad)


def test_config_screen_marks_a_config_the_plan_ignores():
    """A config that resolves to the default plan (comb_smem on a plan without a combine kernel) is an A/A pair: the
    screen line says same_plan=1; any field that differs makes it 0."""
    cs = _script("gpu_config_screen")
    base = {"path": "cuda", "block_N": 64, "num_splits": 33, "comb_smem": False, "last_cta": True}
    assert cs.same_plan(dict(base), base)
    assert not cs.same_plan(base | {"comb_smem": True}, base)
    assert not cs.same_plan(base | {"num_splits": 32}, base)


GPU_TOOLS = ["gpu_child_startup.py", "gpu_code_warm.py", "gpu_config_screen.py", "gpu_flashinfer_check.py",
             "gpu_flush_study.py", "gpu_graph_check.py", "gpu_kernel_timeline.py", "gpu_read_bound.py",
             "gpu_timing_check.py", "gpu_timing_overhead.py", "prewarm_kernels.py"]


@pytest.mark.parametrize("tool", GPU_TOOLS)
def test_gpu_tools_say_in_one_line_that_they_need_a_gpu(tool):
    """On a host without a CUDA device every GPU-only script stops with one line on stderr and exit 2 (not a
    traceback): what a user who runs one on the wrong machine needs to read."""
    from kopt import hardware

    if hardware.cuda_missing(tool) is None:
        pytest.skip("a CUDA device is visible here")
    args = ["--cases", "5", "--configs", "a={}"] if tool == "gpu_config_screen.py" else []
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / tool), *args], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "needs a CUDA device" in r.stderr


def test_every_gpu_script_is_in_that_list():
    assert sorted(p.name for p in (ROOT / "scripts").glob("gpu_*.py")) + ["prewarm_kernels.py"] == sorted(GPU_TOOLS)


def test_code_warm_bad_config_exits_2_in_one_line():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_code_warm.py"), "--config", "[1]"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.startswith("error: --config '[1]'")
    assert len(r.stderr.strip().splitlines()) == 1


def test_kernel_timeline_too_few_calls_exits_2_in_one_line():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_kernel_timeline.py"), "--calls", "5"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.strip() == "error: --calls must be at least 20, got 5"


def test_kernel_timeline_bad_configs_exit_2_in_one_line():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_kernel_timeline.py"), "--configs", "nolabel"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.strip() == "error: config 'nolabel': want label=JSON"


def test_config_screen_lays_configs_over_the_plan_as_config_keys():
    """resolved_config: a plan as the config that pins it (what '+{..}' is laid over): booleans as 0/1, the fields that
    describe the call (path, paged, page_size) and any field that is no config key of the candidate left out."""
    cs = _script("gpu_config_screen")

    class Mod:
        _CFG_KEYS = ("block_N", "pdl", "fused")

    plan = {"path": "cuda", "paged": False, "page_size": 0, "block_N": 128, "pdl": True, "fused": False, "scale": 0.1}
    assert cs.resolved_config(Mod, plan) == {"block_N": 128, "pdl": 1, "fused": 0}
    assert cs.resolved_config(object(), plan) == {"block_N": 128, "pdl": 1, "fused": 0, "scale": 0.1}


def test_config_screen_bad_configs_exit_2():
    r = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[1] / "scripts" / "gpu_config_screen.py"),
                        "--cases", "10", "--configs", "nolabel"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("error: config 'nolabel'")


def test_prewarm_keys_kernels_by_every_field_the_candidate_builds_from():
    """prewarm_kernels dedupes kernels by plan fields taken from the candidate's own plan: every field that
    run_kernel._cuda_kernels reads to build (a new field must not be dropped, as a list kept in the script
    once did), and none of the runtime ones."""
    import inspect
    import re

    pk = _script("prewarm_kernels")
    sys.path.insert(0, pk.SOL)
    import run_kernel as rk

    fields = pk._kernel_fields(rk)
    read = set(re.findall(r"\bp\.(\w+)", inspect.getsource(rk._cuda_kernels)))
    assert read - set(fields) == {"target"}, read - set(fields)
    assert not set(fields) & set(pk._RUNTIME_FIELDS)


def test_prewarm_lays_a_plus_config_over_the_plan_as_the_screen_does():
    """'+{..}' over a case's plan: the screen lays its configs over run_kernel.plan_info (last_cta only where
    there are splits); prewarm must compile that same kernel, not the raw plan's."""
    pk = _script("prewarm_kernels")
    sys.path.insert(0, pk.SOL)
    import run_kernel as rk

    p = rk._Plan()
    for f in rk._Plan.__slots__:
        setattr(p, f, None)
    p.block_N, p.num_splits, p.num_stages, p.threads, p.fused, p.eager, p.last_cta = 64, 1, 1, 128, True, False, True
    p.balanced, p.q_loop, p.merge_unroll, p.bal_combine, p.pdl, p.comb_unroll = 0, False, 0, False, False, 0
    over = pk._over(rk, p)
    assert over["last_cta"] == 0 and over["fused"] == 1 and over["block_N"] == 64  # one split: no last-CTA merge
    p.num_splits = 4
    assert pk._over(rk, p)["last_cta"] == 1
    assert set(over) <= set(rk._CFG_KEYS)


def test_prewarm_reports_a_kernel_that_fails_to_build_and_goes_on():
    """A build error comes back as text (a compiler's exception may not pickle: the pool lost its worker and
    every later kernel once), so the other kernels still compile."""
    pk = _script("prewarm_kernels")
    spec, seconds, err = pk._compile((("dtype", "no-such-dtype"),))
    assert spec == (("dtype", "no-such-dtype"),) and seconds >= 0 and err and len(err) <= 300


def test_config_screen_watchdog_reports_a_hang_and_exits_3():
    """A config with no result in time (a hanging kernel blocks the process in a CUDA wait) is printed as HUNG
    and the screen exits 3, so the campaign's next screen line still runs; a cancelled watchdog does nothing."""
    code = ("import sys, time; sys.path.insert(0, {root!r}); import runpy; "
            "m = runpy.run_path({path!r}, run_name='screen'); d = m['watchdog']({s}, 'case=10 config=x HUNG'); "
            "{then}; time.sleep(1.5); print('done')")
    path = str(ROOT / "scripts" / "gpu_config_screen.py")
    p = subprocess.run([sys.executable, "-c", code.format(root=str(ROOT), path=path, s=0.2, then="pass")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 3 and p.stdout.strip() == "case=10 config=x HUNG"
    p = subprocess.run([sys.executable, "-c", code.format(root=str(ROOT), path=path, s=0.5, then="d.cancel()")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "done"
