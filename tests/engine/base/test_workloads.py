"""Held-out workloads: the library validates, draws are reproducible and reach shapes the named cases do not,
the verdict times and reports them, the improvement rule calls a named-only gain `overfit`, and a user's own
shape is one command (bad input: exit 2, one line, nothing written)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from kopt import workloads
from kopt.cases import load_file
from kopt.errors import CaseError
from kopt.eval.verdict import Verdict
from kopt.policy import iterations, ranking
from kopt.records import CaseResult, parse_line

REPO = Path(__file__).resolve().parents[3]
ADV = Path(__file__).resolve().parents[2] / "adversarial"
HONEST = Path(__file__).resolve().parents[2] / "candidates" / "torch_honest.py"


def write(tmp_path: Path, data: dict) -> Path:
    p = tmp_path / "workloads.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_the_library_loads_with_a_dozen_families_and_every_ratio_asked_for():
    wf = workloads.load(REPO / "bench" / "workloads.yaml")
    assert len(wf.models) >= 12
    assert {m.head_dim for m in wf.models} == {64, 128}
    gqa = {m.gqa for m in wf.models}
    assert {1, 3, 5, 7, 16} <= gqa and any(m.kv_heads == 1 for m in wf.models)  # MHA, odd ratios, MQA
    assert {d.kind for d in wf.lengths} == {"equal", "uniform", "lognormal", "fewlong"}
    assert min(wf.batches) == 1 and max(wf.batches) == 256 and None in wf.page_sizes and 256 in wf.page_sizes


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["models"][0].update(kv_heads=3), "models.0"),            # 32 heads over 3 KV heads
    (lambda d: d["models"][1].update(head_dim=96), "models.1.head_dim"),
    (lambda d: d["models"][2].pop("q_heads"), "models.2.q_heads"),
    (lambda d: d["models"].append(dict(d["models"][0])), "models"),       # a repeated name
    (lambda d: d["lengths"].append({"kind": "zipf"}), "lengths.4.kind"),
    (lambda d: d["page_sizes"].append(48), "page_sizes.5"),
    (lambda d: d.update(batches=[]), "batches"),
])
def test_a_bad_entry_is_rejected_with_its_field_named(tmp_path, edit, field):
    data = yaml.safe_load((REPO / "bench" / "workloads.yaml").read_text())
    edit(data)
    with pytest.raises(CaseError, match=rf"invalid at {field}\b"):
        workloads.load(write(tmp_path, data))


def test_draws_are_reproducible_from_the_seed_and_leave_the_named_shapes():
    wf = workloads.load(REPO / "bench" / "workloads.yaml")
    a, b, c = workloads.draw(wf, 12, 7), workloads.draw(wf, 12, 7), workloads.draw(wf, 12, 8)
    assert [x.model_dump() for x in a] == [x.model_dump() for x in b]
    assert [x.model_dump() for x in a] != [x.model_dump() for x in c]
    named = {(x.variant.head_dim, x.gqa) for x in load_file(REPO / "bench" / "cases.yaml").cases}
    for seed in range(5):
        got = {(x.variant.head_dim, x.gqa) for x in workloads.draw(wf, 12, seed)}
        assert len(got - named) >= 3, (seed, got)
    for x in workloads.draw(wf, 64, 3):
        assert x.kind == "heldout" and x.model and 1 <= min(x.seq_lengths()) and max(x.seq_lengths()) == x.seqlen_k
        assert x.batch * x.seqlen_k * 2 * x.kv_heads * x.variant.head_dim * 2 <= wf.max_cache_bytes
        assert x.id > workloads.HELDOUT_BASE
        assert x.shape_label().startswith(f"hq{x.q_heads}-hkv{x.kv_heads}-d{x.variant.head_dim}-b{x.batch}-")


def test_a_cpu_draw_keeps_heads_head_dim_dtype_and_layout_at_cpu_size():
    wf = workloads.load(REPO / "bench" / "workloads.yaml")
    for full, cpu in zip(workloads.draw(wf, 12, 11), workloads.draw(wf, 12, 11, cpu=True)):
        assert (cpu.model, cpu.kv_heads, cpu.gqa, cpu.variant) == (full.model, full.kv_heads, full.gqa, full.variant)
        assert cpu.batch <= workloads.CPU_BATCH and cpu.seqlen_k <= workloads.CPU_MAX_LEN


@pytest.mark.parametrize("spec, want", [("100", [100] * 3), ("5,6,7", [5, 6, 7])])
def test_length_specs(spec, want):
    assert workloads.parse_lengths(spec, 3)[0] == want
    lens, kind = workloads.parse_lengths("fewlong:1000:2", 4)
    assert kind == "fewlong" and max(lens) == 1000 and len(lens) == 4


def kopt_cli(ws: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kopt", *args], cwd=ws, capture_output=True, text=True,
                          timeout=120, env={**__import__("os").environ, "KOPT_WORKSPACE": str(ws)})


@pytest.mark.parametrize("args, says", [
    (["--model", "gpt-9", "--lengths", "10"], "unknown model 'gpt-9'"),
    (["--shape", "14,3,64", "--lengths", "10"], "not a multiple"),
    (["--shape", "32,8", "--lengths", "10"], "QUERY_HEADS,KV_HEADS,HEAD_DIM"),
    (["--shape", "32,8,96", "--lengths", "10"], "--shape"),
    (["--model", "qwen2.5-7b"], "need --lengths"),
    (["--model", "qwen2.5-7b", "--lengths", "zipf:100"], "--lengths 'zipf:100'"),
    (["--model", "qwen2.5-7b", "--lengths", "1,2", "--batch", "3"], "--batch is 3"),
    (["--model", "qwen2.5-7b", "--lengths", "0"], "at least 1"),
    (["--model", "qwen2.5-7b", "--shape", "32,8,128", "--lengths", "9"], "exclusive"),
    (["--model", "qwen2.5-7b", "--lengths", "9", "--case", "4"], "leave out --case"),
    (["--model", "qwen2.5-7b", "--lengths", "9", "--dtype", "fp8"], "--dtype"),
    (["--case", "4,1003"], "case 1003 is a held-out draw: give the verdict's --heldout-seed"),
    (["--case", "1013", "--heldout-seed", "5"], "held-out ids are 1001-1012"),
    (["--case", "1004", "--heldout", "3", "--heldout-seed", "5"], "held-out ids are 1001-1003"),
    (["--case", "4", "--heldout", "3"], "--heldout goes with --heldout-seed"),
])
def test_bad_model_or_shape_input_is_one_line_and_exit_2(tmp_path, args, says):
    ws = tmp_path / "user"
    (ws / "bench").mkdir(parents=True)
    shutil.copy(REPO / "bench" / "workloads.yaml", ws / "bench")
    shutil.copy(REPO / "bench" / "cases.yaml", ws / "bench")
    before = sorted(p.name for p in ws.rglob("*"))
    p = kopt_cli(ws, "bench", "--device", "cpu", *args)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and p.stdout == ""
    assert sorted(p.name for p in ws.rglob("*")) == before, "nothing written"


def row(case, kind, speedup, correct=True, model=None, status="ok", **kw) -> CaseResult:
    return CaseResult(row_id=uuid.uuid4().hex, case=case, case_kind=kind, compiled=True, correct=correct,
                      speedup=speedup, model=model, status=status, **kw)


def fields(line: str) -> dict:
    return parse_kv(line)


def parse_kv(line: str) -> dict:
    return dict(tok.split(":", 1) for tok in line.split())


def test_the_verdict_line_reports_each_group_and_names_a_failed_draw():
    perf = [row(4, "perf", 2.0, pct_limit=50.0), row(15, "ragged", 1.5, pct_limit=40.0),
            row(19, "seed", 1.2, pct_limit=30.0)]
    held = [row(1001, "heldout", 1.1, model="llama-3.1-8b", pct_limit=70.0),
            row(1002, "heldout", 0.9, model="mistral-7b", pct_limit=60.0),
            row(1003, "heldout", None, correct=False, model="qwen2.5-0.5b", status="compile_error")]
    held[2].compiled = False
    v = Verdict(perf, [], [], held, heldout_seed=42)
    f = parse_kv(v.line())
    assert f["VERDICT"] == "fail" and f["HELDOUT"] == "3" and f["HELDOUT_SEED"] == "42"
    assert f["HELDOUT_CORRECT"] == "2/3" and f["FAILED"] == "1003/qwen2.5-0.5b=compile_error"
    assert f["GEOMEAN_SPEEDUP"] == "2.0000x", "seed and held-out rows stay out of the uniform geomean"
    assert f["GEOMEAN_SPEEDUP_SEED"] == "1.2000x" and f["MIN_SPEEDUP_HELDOUT"] == "0.9000x"
    assert f["GEOMEAN_SPEEDUP_HELDOUT"] == f"{(1.1 * 0.9) ** 0.5:.4f}x"
    assert f["GEOMEAN_PCT_LIMIT_HELDOUT"] == f"{(70 * 60) ** 0.5:.1f}" and f["HELDOUT_VS_BEST"] == "NA"
    g = ranking.geomeans([r.model_dump(mode="json") for r in perf + held])
    assert (g.uniform, g.n_uniform, g.seed, g.n_heldout) == (2.0, 1, 1.2, 2)


def test_the_rule_calls_a_named_gain_that_loses_held_out_overfit():
    mine = [row(4, "perf", 1.5, run_id="v2").model_dump(mode="json")] + \
           [row(1000 + i, "heldout", s, run_id="v2").model_dump(mode="json") for i, s in ((1, 1.0), (2, 0.8))]
    theirs = [row(1000 + i, "heldout", s, mode="heldout", paired_run="v2", candidate_id="best0").model_dump(mode="json")
              for i, s in ((1, 1.3), (2, 1.1))]
    other = [row(1001, "heldout", 9.9, mode="heldout", paired_run="v9").model_dump(mode="json")]  # another draw
    ratio = ranking.heldout_ratio(mine, theirs)
    assert ratio == pytest.approx(((1.0 / 1.3) * (0.8 / 1.1)) ** 0.5)
    j = iterations.judge(1.5, None, False, 1.2, None, 0.03)
    assert j.outcome == "improved"
    got = iterations.weigh_heldout(j, mine, mine + theirs + other, 0.03)
    assert got.outcome == "overfit" and "best0" in got.reason and "held-out" in got.reason
    even = [dict(r, speedup=r["speedup"] * 1.02) for r in theirs]  # within the noise: still improved
    fair = [dict(r, speedup=s) for r, s in zip(theirs, (1.0, 0.8))]
    assert iterations.weigh_heldout(j, mine, mine + fair, 0.03).outcome == "improved"
    assert iterations.weigh_heldout(j, mine, mine + even, 0.5).outcome == "improved"
    assert iterations.weigh_heldout(j, mine, mine, 0.03) == j, "no reigning rows: the named rule alone"


def test_the_rule_calls_a_held_out_gain_with_the_named_cases_held_improved():
    """Not improved on the named cases (neither geomean gains, neither loses beyond the threshold) but faster than the
    reigning candidate on the verdict's own held-out draws by the threshold: improved, with the reason; a named loss
    beyond the threshold, a held-out gain inside it, or a failed verdict stay as the named rule says."""
    mine = [row(4, "perf", 1.21, run_id="v2").model_dump(mode="json")] + \
           [row(1000 + i, "heldout", s, run_id="v2").model_dump(mode="json") for i, s in ((1, 1.3), (2, 1.2))]
    theirs = [row(1000 + i, "heldout", s, mode="heldout", paired_run="v2", candidate_id="best0").model_dump(mode="json")
              for i, s in ((1, 1.0), (2, 1.1))]
    j = iterations.judge(1.21, 2.0, False, 1.2, 2.01, 0.03)
    assert j.outcome == "not improved" and j.named_held
    got = iterations.weigh_heldout(j, mine, mine + theirs, 0.03)
    assert got.outcome == "improved" and "best0" in got.reason and "deployed shapes gain" in got.reason
    lost = iterations.judge(1.21, 1.8, False, 1.2, 2.01, 0.03)   # ragged -10%: the named cases did not hold
    assert lost.outcome == "not improved" and not lost.named_held
    assert iterations.weigh_heldout(lost, mine, mine + theirs, 0.03).outcome == "not improved"
    close = [dict(r, speedup=s) for r, s in zip(theirs, (1.28, 1.19))]   # +1%: inside the threshold
    kept = iterations.weigh_heldout(j, mine, mine + close, 0.03)
    assert kept.outcome == "not improved" and "held-out +1." in kept.reason
    failed = iterations.judge(1.21, 2.0, True, 1.2, 2.01, 0.03)
    assert iterations.weigh_heldout(failed, mine, mine + theirs, 0.03) == failed
    alone = iterations.judge(1.21, None, False, 1.2, None, 0.03)   # the uniform rule alone, within the noise
    assert iterations.weigh_heldout(alone, mine, mine + theirs, 0.03).outcome == "improved"


def test_status_and_the_journal_weigh_held_out_draws(tmp_path, monkeypatch, git_env):
    """A named gain that loses held-out is overfit; then named cases held and held-out draws faster than the
    reigning candidate's is improved: status and ITERATIONS.md say both."""
    from typer.testing import CliRunner

    from kopt.cli.main import app
    from kopt.store import ledger
    from kopt.store.vcs import candidate_hash

    ws = tmp_path / "loop"
    run = lambda *a: CliRunner().invoke(app, [str(x) for x in a])  # noqa: E731
    assert run("init", ws).exit_code == 0
    monkeypatch.setenv("KOPT_WORKSPACE", str(ws))
    kernel = ws / "solution" / "tilelang" / "run_kernel.py"
    first = None
    for k, (named, held, reign) in enumerate([(1.2, 1.0, None), (1.5, 0.7, 1.0), (1.2, 1.3, 1.0)], 1):
        kernel.write_text(kernel.read_text() + f"\n# try {k}\n")
        h, cid = candidate_hash(kernel)
        rid = f"run{k}"
        rows = [row(c, "perf", named, run_id=rid, mode="verdict", candidate_hash=h, candidate_id=cid, device="cpu",
                    verdict_rows=3) for c in (4, 5)]
        rows.append(row(1001, "heldout", held, run_id=rid, mode="verdict", candidate_hash=h, candidate_id=cid,
                        device="cpu", verdict_rows=3, model="qwen2.5-7b", heldout_seed=5))
        if reign:
            rows.append(row(1001, "heldout", reign, mode="heldout", paired_run=rid, candidate_id=first,
                            device="cpu", model="qwen2.5-7b", heldout_seed=5))
        ledger.append(ws / "candidates.jsonl", rows)
        first = first or cid
        assert run("log", "--title", f"try {k}", "--hypothesis", "h", "--analysis", "a", "--next", "n").exit_code == 0
        assert run("commit", "-m", f"try {k}").exit_code == 0
    s = json.loads(run("status", "--json").stdout)
    assert [it["outcome"] for it in s["recent"]] == ["improved", "overfit", "improved"]
    text = (ws / "ITERATIONS.md").read_text()
    assert "-> overfit" in text and "held-out" in text
    assert "the deployed shapes gain, the named cases hold" in text.split("## Iteration 3")[1]


def test_verify_times_the_reigning_candidate_on_the_same_draws(tmp_path, monkeypatch):
    """A real CPU verify of the named-only cheat, paired with an honest reigning candidate: both timed on the
    same held-out draws and recorded (the figures are timings: structure is checked, not which is faster)."""
    ws = tmp_path / "user"
    (ws / "bench").mkdir(parents=True)
    shutil.copy(REPO / "bench" / "workloads.yaml", ws / "bench")
    cf = yaml.safe_load((REPO / "bench" / "cases.yaml").read_text())
    cf["cases"] = [c for c in cf["cases"] if c["id"] in (1, 5)]
    cf["verify"] = {"seeds": 1, "matrix": [], "hidden": 0, "heldout": 2}
    (ws / "bench" / "cases.yaml").write_text(yaml.safe_dump(cf))
    shutil.copy(ADV / "overfit_named.py", ws / "overfit_named.py")
    shutil.copy(ADV / "_ref.py", ws / "_ref.py")
    p = kopt_cli(ws, "verify", "overfit_named.py", "--device", "cpu", "--quick-timing", "--machine",
                 "--heldout-seed", "3", "--against", str(HONEST))
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.strip().splitlines()
    f = parse_kv(lines[-1])
    assert f["VERDICT"] == "pass" and f["HELDOUT"] == "2" and f["HELDOUT_SEED"] == "3" and f["BEST"] != "NA"
    assert f["HELDOUT_VS_BEST"].endswith("x") and f["GEOMEAN_SPEEDUP_HELDOUT"] != "NA"
    rows = [json.loads(x) for x in (ws / "candidates.jsonl").read_text().splitlines()]
    mine = [r for r in rows if r["mode"] == "verdict" and r["case_kind"] == "heldout"]
    theirs = [r for r in rows if r["mode"] == "heldout"]
    assert len(mine) == len(theirs) == 2 and {r["paired_run"] for r in theirs} == {mine[0]["run_id"]}
    assert [(r["case"], r["shape"], r["variant"]) for r in mine] == [(r["case"], r["shape"], r["variant"])
                                                                    for r in theirs]
    assert all(r["heldout_seed"] == 3 and r["model"] for r in mine + theirs)
    want = [c.shape_label() for c in workloads.draw(workloads.load(ws / "bench" / "workloads.yaml"), 2, 3, cpu=True)]
    assert [r["shape"] for r in mine] == want, "the draw is the seed's, as `kopt workloads --draw` shows it"
    for line in lines[:-1]:
        parse_line(line)
    assert ranking.heldout_ratio(mine, theirs) == pytest.approx(float(f["HELDOUT_VS_BEST"][:-1]), abs=5e-5)  # 4 places


def test_the_report_shows_the_groups_and_each_held_out_draw():
    from types import SimpleNamespace

    from kopt.report.page import _heldout_section

    direct = {"kernel": "decode_direct", "block_N": 64}
    rows = [row(4, "perf", 1.6, run_id="v1", mode="verdict").model_dump(mode="json"),
            row(1001, "heldout", 1.2, run_id="v1", mode="verdict", model="qwen2.5-7b", heldout_seed=9,
                shape="hq28-hkv4-d128-b16-s2048-equal", plan=direct, pct_limit=40.0,
                limit_ms=0.0029).model_dump(mode="json"),
            row(1002, "heldout", None, correct=False, run_id="v1", mode="verdict", model="smollm2-360m",
                status="runtime_error").model_dump(mode="json"),
            row(1001, "heldout", 1.5, mode="heldout", paired_run="v1", candidate_id="reign0").model_dump(mode="json")]
    c = SimpleNamespace(shown=SimpleNamespace(verdict_run="v1"), ledger=SimpleNamespace(rows=rows), floor_ms=0.0029)
    html = _heldout_section(c)
    assert "qwen2.5-7b" in html and "hq28-hkv4-d128-b16-s2048-equal" in html and "runtime_error" in html
    assert "--heldout-seed 9" in html and "reign0" in html and "0.800x" in html  # 1.2 / 1.5 on the same draw
    assert "held-out" in html and "1.200x" in html
    # where the geomean is lost: the draw's plan, at the launch floor, and the geomean were that plan at its limit
    assert "Where the held-out geomean is lost" in html and "<td class='l'>direct floor</td><td class=''>1</td>" in html
    assert "1001 (seed 9): 40.0" in html and "100.0" in html
    c.shown.verdict_run = "v0"
    assert "has no held-out rows" in _heldout_section(c)


def test_the_peer_panel_names_each_draw_and_gives_each_group_its_geomean():
    from kopt.report import panel

    def prow(case, kind, best, model=None):
        return row(case, kind, best, model=model, shape="hq8-hkv1-d128-b2-s99-equal" if model else None,
                   mode="peers", variant="bf16-d128-contig-ragged",
                   peers=[{"peer": "fa2", "ref": "flash_attn-2.8.3", "correct": True, "speedup": best,
                           "timing": {"method": "cupti", "median_ms": 0.01, "q1_ms": 0.01, "q3_ms": 0.01,
                                      "min_ms": 0.01, "n": 5, "rel_iqr": 0.0},
                           "ref_timing": {"method": "cupti", "median_ms": 0.01 * best, "q1_ms": 0.01,
                                          "q3_ms": 0.01, "min_ms": 0.01, "n": 5, "rel_iqr": 0.0}}]).model_dump(
            mode="json")

    p = panel.build([prow(4, "perf", 2.0), prow(19, "seed", 1.5), prow(1001, "heldout", 0.8, "llama-3.1-70b-tp8"),
                     prow(1002, "heldout", 1.25, "qwen2.5-7b")], {4: "perf", 19: "seed"})
    text = "\n".join(panel.notes(p))
    assert "edge + perf: 2.00x (1 cases)" in text and "seed: 1.50x (1 cases)" in text
    assert "held-out: 1.00x (2 cases)" in text
    assert any("llama-3.1-70b-tp8 hq8-hkv1" in r.variant for r in p.rows)


def test_a_verdict_pairs_with_the_best_on_its_own_device(tmp_path, monkeypatch):
    """A verdict's parent and the candidate its held-out draws are paired with are ranked over rows of the verdict's
    device: a CPU screen's 4x does not outrank a GPU verdict's 1.5x there."""
    from kopt import hardware
    from kopt.cli.verify import current_best
    from kopt.store import ledger

    path = tmp_path / "candidates.jsonl"
    ledger.append(path, [row(4, "perf", 4.0, candidate_id="cpu000000001", device="cpu", runtime_ms=1.0,
                             ref_runtime_ms=4.0),
                         row(4, "perf", 1.5, candidate_id="h20000000001", device="H200", mode="verdict",
                             runtime_ms=0.01, ref_runtime_ms=0.015),
                         row(4, "perf", 1.2, candidate_id="h20000000002", device="H200", mode="verdict",
                             runtime_ms=0.0125, ref_runtime_ms=0.015)])
    assert current_best(path, "H200") == "h20000000001"
    assert current_best(path, "cpu") == "cpu000000001"
    assert current_best(path, "H100") is None, "no rows of that device: no best, so no pairing"
    assert current_best(path, None) == "cpu000000001", "a device whose name cannot be read ranks every row"
    assert current_best(tmp_path / "none.jsonl", "H200") is None
    assert hardware.device_label("cpu") == "cpu"
    monkeypatch.setattr(hardware, "driver", lambda: None)
    assert hardware.device_label("cuda") is None and hardware.device_label("cuda:1") is None
