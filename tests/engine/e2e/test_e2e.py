"""kopt e2e: the KV store and the reference attention, the verdict rule, the E2E line and row, the CLI's usage
errors, and the tiny CPU configuration end to end (the shipped candidate passes with identical tokens; a planted
error in one head fails with the step and the logit gap named). The CUDA-graph path is a `gpu` test."""

from __future__ import annotations

import json
import textwrap

import pytest

from conftest import SHIPPED, failure, kopt
from kopt.e2e import check, kvcache
from kopt.e2e.models import E2EOptions, E2EResult, StepGap, latest_line, parse_line
from kopt.records import Status, TimingStats

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _own_fit_cache(monkeypatch, tmp_path):
    """Fitted decoders go to this test's own folder, never the user's cache (and never one another test filled)."""
    monkeypatch.setenv("KOPT_FIT_CACHE", str(tmp_path / "fits"))


def _gap(step, vs_fp32=0.01, allowed=0.1, same=True, base=0.01):
    return StepGap(step=step, same=same, vs_base=vs_fp32, vs_fp32=vs_fp32, base_vs_fp32=base, allowed=allowed)


# ---------------------------------------------------------------- the KV store

@pytest.mark.parametrize("page", [None, 16])
def test_a_step_writes_only_its_token_at_each_sequence_position(page):
    g = torch.Generator().manual_seed(0)
    src = kvcache.empty_store(1, 3, 40, 2, 8, torch.float32, "cpu")
    st = kvcache.relaid(src, page, seed=1)
    st.pos.copy_(torch.tensor([0, 5, 33]))
    key, value = torch.randn(3, 2, 1, 8, generator=g), torch.randn(3, 2, 1, 8, generator=g)
    st.write(0, key, value)
    k, v = st.contiguous(0)
    for b, p in enumerate([0, 5, 33]):
        assert torch.equal(k[b, p], key[b, :, 0]) and torch.equal(v[b, p], value[b, :, 0])
    assert int((k != 0).any(-1).any(-1).sum()) == 3, "nothing else of the cache is touched"


def test_prefill_fills_every_layout_alike_and_relaying_keeps_the_cache():
    g = torch.Generator().manual_seed(0)
    master = kvcache.empty_store(2, 2, 50, 2, 8, torch.float32, "cpu")
    key, value = torch.randn(2, 2, 20, 8, generator=g), torch.randn(2, 2, 20, 8, generator=g)
    master.write(1, key, value, start=0)
    assert torch.equal(master.k[1][:, :20], key.transpose(1, 2))
    paged = kvcache.relaid(master, 16, seed=3)
    assert paged.page == 16 and paged.block_table.shape == (2, 4)
    k, v = paged.contiguous(1)
    assert torch.equal(k[:, :50], master.k[1]) and torch.equal(v[:, :50], master.v[1])
    assert paged.k[1].data_ptr() != master.k[1].data_ptr(), "each run decodes in its own cache"


@pytest.mark.parametrize("page", [None, 16])
def test_the_fp32_attention_is_kopts_reference(page):
    from kopt.reference import reference
    from kopt.workload import Workload

    g = torch.Generator().manual_seed(2)
    st = kvcache.empty_store(1, 3, 48, 2, 16, torch.bfloat16, "cpu")
    st.k[0].copy_(torch.randn(st.k[0].shape, generator=g))
    st.v[0].copy_(torch.randn(st.v[0].shape, generator=g))
    st = kvcache.relaid(st, page, seed=0)
    q = torch.randn(3, 1, 8, 16, generator=g).to(torch.bfloat16)
    lens = torch.tensor([1, 30, 48], dtype=torch.int32)
    got = kvcache.fp32_attention(q, st.k[0], st.v[0], lens, st.block_table, 0.25)
    want = reference(Workload(q, st.k[0], st.v[0], lens, st.block_table, 0.25, 0))
    assert got.dtype == torch.bfloat16
    assert torch.allclose(got.float(), want, atol=1e-2, rtol=1e-2)


class _Attn:
    layer_idx = 1


def _decode_with(fn, step=3, who="candidate"):
    st = kvcache.empty_store(2, 1, 8, 2, 4, torch.float32, "cpu")
    a = kvcache.ACTIVE
    a.store, a.decode, a.prefill, a.step, a.who = st, fn, False, step, who
    q, k = torch.randn(1, 4, 1, 4), torch.randn(1, 2, 1, 4)
    return kvcache.attention(_Attn(), q, k, k.clone(), None, scaling=0.5)


def test_a_raising_or_misshapen_candidate_is_named_with_its_step_and_layer():
    def boom(*a):
        raise RuntimeError("kernel launch failed\nsecond line")

    with pytest.raises(kvcache.CandidateFailure, match=r"^decode step 3, layer 1: run raised RuntimeError: kernel "
                                                        r"launch failed$"):
        _decode_with(boom)
    with pytest.raises(kvcache.CandidateFailure, match=r"layer 1: run returned \(1, 1, 4, 2\)"):
        _decode_with(lambda q, *a: q[..., :2])
    out, _ = _decode_with(lambda q, *a: q * 2)
    assert out.shape == (1, 1, 4, 4)
    with pytest.raises(kvcache.CandidateFailure, match=r"layer 1: the baseline raised RuntimeError") as e:
        _decode_with(boom, who="baseline")
    assert e.value.who == "baseline", "a failing baseline is not the candidate's failure"


# ---------------------------------------------------------------- the rule

def test_the_first_step_over_its_allowance_fails_with_the_step_and_the_gap():
    gaps = [_gap(0), _gap(1, vs_fp32=0.5, allowed=0.12, base=0.03), _gap(2, vs_fp32=0.9)]
    j = check.judge(gaps, None, None, None, None, None, 3)
    assert not j.passed and j.status == Status.incorrect_numerical
    assert j.message.startswith("decode step 1: logit gap to the fp32-attention run 0.5 > allowed 0.12")
    assert "tokens the same for 3/3 steps" in j.message


def test_tokens_that_part_pass_only_at_a_near_tie():
    gaps = [_gap(0), _gap(1, allowed=0.1)]
    assert check.judge(gaps, None, 1, 0.05, None, None, 2).passed
    j = check.judge(gaps, None, 1, 0.3, None, None, 2)
    assert not j.passed and j.message.startswith("decode step 1: greedy token differs") and "1/2 steps" in j.message
    assert check.judge(gaps, 0, None, None, None, None, 2).status == Status.nan_inf
    assert not check.judge(gaps, None, None, None, "called 0 times", None, 2).passed
    assert not check.judge(gaps, None, None, None, None, False, 2).passed
    assert check.judge(gaps, None, None, None, None, None, 2).passed, "no profiler (a CPU): NA, not a failure"


def test_parting_and_tie_margin():
    base = torch.tensor([[1, 2], [3, 4], [5, 6]])
    assert check.first_parting(base, base.clone()) is None
    other = base.clone()
    other[1, 1] = 9
    assert check.first_parting(base, other) == 1
    logits = torch.zeros(2, 10)
    logits[1, 4], logits[1, 9] = 2.0, 1.75
    assert check.tie_margin(logits, base[1], other[1]) == pytest.approx(0.25)


@pytest.mark.parametrize("timed, want", [
    ({"gemm": 8, "tl_decode": 4}, True),
    ({"gemm": 8, "tl_decode": 2}, False),                  # fewer than once per layer per replay
    ({"gemm": 8, "tl_decode": 4, "flash_fwd": 4}, False),  # the baseline's kernel ran in the candidate's step
    ({"gemm": 8, "flash_fwd": 4}, False),                   # a fallback: the candidate's kernel never ran
    ({}, None),                                             # the profiler saw nothing: NA
])
def test_the_profiler_check_wants_the_candidates_kernels_once_per_layer(monkeypatch, timed, want):
    from collections import Counter

    fake = {"null": {"gemm": 4, "fill": 1}, "cand": {"tl_decode": 1}, "base": {"flash_fwd": 1, "fill": 1},
            "timed": timed}
    monkeypatch.setattr(check, "kernel_names", lambda fn, repeat=1: Counter(fake[fn()]))
    seen, names = check.kernels_seen(lambda: "timed", lambda: "null", lambda: "cand", lambda: "base", layers=2)
    assert seen is want
    if want is not None:
        assert names["candidate_standalone"] == ["tl_decode"] and names["baseline_standalone"] == ["flash_fwd"]


# ---------------------------------------------------------------- the line and the row

def _result(**kw) -> E2EResult:
    t = TimingStats(method="graph", median_ms=2.0, q1_ms=1.9, q3_ms=2.1, min_ms=1.8, n=60, rel_iqr=0.1)
    r = TimingStats(method="graph", median_ms=2.5, q1_ms=2.4, q3_ms=2.6, min_ms=2.3, n=60, rel_iqr=0.1)
    base = dict(options=E2EOptions(model="tinyllama-1.1b", layers=22, tokens=64, device="cuda", page_size=256),
                passed=True, candidate_id="abcdef012345", device="H200", ref="flash_attn-2.8.3", tokens_same=64,
                steps=[_gap(0)], max_logit_diff=0.0, max_logit_diff_fp32=0.0625, base_logit_diff_fp32=0.0625,
                timing=t, ref_timing=r, step_speedup=1.25, attn_share=0.31, ref_attn_share=0.45, kernels_seen=True)
    return E2EResult(**{**base, **kw})


def test_the_line_is_key_value_fields_with_na_for_what_was_not_measured():
    line = _result().line()
    f = parse_line(line)
    assert line.startswith("E2E:pass MODEL:tinyllama-1.1b LAYERS:22 BATCH:1 PROMPT:32 FIT_STEPS:NA FIT_LOSS:NA "
                           "FIT_COPY:NA TOKENS_SAME:64/64 COPIED:NA BASE_TOKENS_SAME_FP32:NA ")
    fitted = parse_line(_result(fit_steps_taken=212, fit_loss=0.0081, fit_copy=0.984375, copied=64).line())
    assert fitted["FIT_STEPS"] == "212" and fitted["FIT_LOSS"] == "0.0081" and fitted["COPIED"] == "64/64"
    assert fitted["FIT_COPY"] == "0.9844"
    assert f["STEP_MS"] == "2.0000" and f["REF_STEP_MS"] == "2.5000" and f["STEP_SPEEDUP"] == "1.2500x"
    assert f["KERNELS_SEEN"] == "True" and f["GRAPH"] == "True" and f["PAGE"] == "256" and f["FAIL_STEP"] == "NA"
    assert all(len(x.split(":")) == 2 for x in line.split(" "))
    bare = E2EResult(options=E2EOptions(model="m"), status=Status.runtime_error).line()
    f = parse_line(bare)
    assert f["E2E"] == "fail" and f["TOKENS_SAME"] == f["STEP_MS"] == f["KERNELS_SEEN"] == f["ATTN_SHARE"] == "NA"
    with pytest.raises(ValueError):
        parse_line("COMPILED:True CORRECT:True")


def test_e2e_rows_are_recorded_and_stay_out_of_the_ranking_and_verdicts(workspace):
    from kopt import e2e
    from kopt.paths import ledger_file
    from kopt.policy import ranking
    from kopt.store import ledger

    e2e.record(_result(), run_id="r1")
    rows = ledger.load_dicts(ledger_file()).rows
    assert [r["mode"] for r in rows] == ["e2e"] and rows[0]["speedup"] == 1.25 and rows[0]["runtime_ms"] == 2.0
    assert rows[0]["validation"]["max_abs_err"] == 0.0625 and rows[0]["message"].startswith("E2E:pass")
    assert latest_line(rows) == rows[0]["message"]
    assert ranking.rank(ranking.load_frame(ledger_file())[0]).empty
    assert ranking.latest_verdict(rows) == [] and ranking.geomeans(ranking.latest_verdict(rows)).uniform is None


# ---------------------------------------------------------------- the command

def test_usage_errors_are_one_line_and_exit_2(monkeypatch):
    code, err = failure(kopt("e2e", "--model", "tinyllama", "--no-record"))
    assert code == 2 and "unknown model 'tinyllama'; valid models:" in err and len(err.strip().splitlines()) == 1
    code, err = failure(kopt("e2e", "--model", "tinyllama-1.1b", "--prompt-len", "2040", "--tokens", "64",
                             "--device", "cpu"))
    assert code == 2 and "exceed tinyllama-1.1b's context (2048)" in err
    code, err = failure(kopt("e2e", "--model", "tinyllama-1.1b", "--page-size", "8", "--device", "cpu"))
    assert code == 2 and "--page-size" in err
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "transformers" else real(n, *a))
    code, err = failure(kopt("e2e", "--model", "tinyllama-1.1b", "--device", "cpu", "--candidate", SHIPPED))
    assert code == 2 and 'needs Hugging Face transformers: pip install -e ".[e2e]"' in err


@pytest.mark.parametrize("ok", [True, False])
def test_verify_e2e_is_part_of_the_verdict(monkeypatch, workspace, ok):
    from kopt import e2e
    from kopt.eval import verdict
    from kopt.records import CaseResult
    from kopt.store import ledger

    row = CaseResult(row_id="r", run_id="v1", mode="verdict", case=4, compiled=True, correct=True, runtime_ms=1.0,
                     ref_runtime_ms=1.0, speedup=1.0)
    monkeypatch.setattr(verdict, "run_on", lambda *a, **k: verdict.Verdict([row], [], []))
    asked = []

    def fake_run(path, o, timeout_s=600.0):
        asked.append(o)
        return _result(passed=ok, status=Status.ok if ok else Status.incorrect_numerical)

    monkeypatch.setattr(e2e, "run", fake_run)
    res = kopt("verify", SHIPPED, "--e2e", "--device", "cpu", "--heldout", "0", "--no-pair", "--machine")
    lines = res.stdout.strip().splitlines()
    assert res.exit_code == (0 if ok else 1), res.stdout
    assert asked[0].model == "tinyllama-1.1b" and asked[0].layers == 2 and asked[0].page_size == 16
    assert parse_line(lines[-2])["E2E"] == ("pass" if ok else "fail")
    assert lines[-1].startswith("VERDICT:pass " if ok else "VERDICT:fail ") and lines[-1].endswith(
        " E2E:pass" if ok else " E2E:fail")
    rows = ledger.load_dicts(workspace / "candidates.jsonl").rows
    assert [(r["mode"], r["run_id"]) for r in rows] == [("e2e", "v1")]


needs_transformers = pytest.mark.skipif(__import__("importlib").util.find_spec("transformers") is None,
                                        reason="transformers not installed (the e2e extra)")


@needs_transformers
def test_the_tiny_cpu_decoder_passes_with_identical_tokens(workspace, tmp_path):
    out = tmp_path / "e2e.jsonl"
    res = kopt("e2e", "--model", "tinyllama-1.1b", "--device", "cpu", "--page-size", "16", "--candidate", SHIPPED,
               "--machine", "--out", out)
    assert res.exit_code == 0, (res.stdout, res.stderr)
    f = parse_line(res.stdout.strip().splitlines()[-1])
    assert f["E2E"] == "pass" and f["TOKENS_SAME"] == "8/8" and f["STATUS"] == "ok" and f["DEVICE"] == "cpu"
    assert f["BASE_TOKENS_SAME_FP32"] == "8/8"  # the torch-cpu baseline decodes as the fp32-attention decoder does
    assert f["REF"].startswith("torch-cpu") and f["KERNELS_SEEN"] == "NA" and f["GRAPH"] == "False"
    r = E2EResult.model_validate_json(out.read_text())
    assert r.dims["hidden"] <= 256 and r.dims["layers"] == 2 and r.calls == 2 * 8, "one run call per layer and step"
    assert r.backend == "tilelang" and len(r.steps) == 8 and r.timing and r.ref_timing and r.null_timing
    assert all(s.vs_fp32 <= s.allowed for s in r.steps)
    assert 0 < r.base_logit_diff_fp32 < 0.1 and r.max_logit_diff_fp32 <= 2 * r.base_logit_diff_fp32 + 0.1
    rows = [json.loads(x) for x in (workspace / "candidates.jsonl").read_text().splitlines()]
    assert [r["mode"] for r in rows] == ["e2e"] and rows[0]["correct"] is True


@needs_transformers
def test_a_planted_error_in_one_head_fails_with_the_step_and_the_gap(workspace, tmp_path):
    bad = tmp_path / "one_head.py"
    bad.write_text(textwrap.dedent(f'''\
        """The shipped kernel with head 3 given head 4's output (an index bug in one head)."""
        import sys
        sys.path.insert(0, {str(SHIPPED.parent)!r})
        import run_kernel

        BACKEND = "tilelang"


        def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):
            out = run_kernel.run(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale)
            out[:, :, 3] = out[:, :, 4]
            return out
        '''))
    res = kopt("e2e", "--model", "tinyllama-1.1b", "--device", "cpu", "--tokens", "4", "--candidate", bad, "--json",
               "--no-record")
    assert res.exit_code == 1
    r = E2EResult.model_validate_json(res.stdout)
    assert not r.passed and r.status == Status.incorrect_numerical and r.error_kind is None
    assert r.message.startswith("decode step 0: logit gap to the fp32-attention run ")
    gap, allowed = r.steps[0].vs_fp32, r.steps[0].allowed
    assert gap > 2 * allowed and f"{gap:.4g} > allowed {allowed:.4g}" in r.message
    assert parse_line(r.line())["FAIL_STEP"] == "0"


@pytest.mark.gpu
@needs_transformers
def test_the_cuda_graph_step_runs_the_candidates_kernels(workspace):
    from kopt import e2e

    o = e2e.options("tinyllama-1.1b", "cuda", layers=2, batch=2, prompt_len=300, tokens=12, page_size=16)
    r = e2e.run(SHIPPED, o)
    assert r.passed, r.message
    assert r.timing.method == r.ref_timing.method == "graph" and r.calls == 2, "one run call per layer, captured"
    assert r.kernels_seen is True and r.kernels["candidate_standalone"]
    assert r.ref.startswith(("flash_attn", "torch-sdpa")) and r.step_speedup and 0 <= r.attn_share < 1


@pytest.mark.parametrize("page,want_name,want_page", [(16, "flash_attn-2.8.3-paged256", 256),
                                                      (256, "flash_attn-2.8.3", 256), (None, "flash_attn-2.8.3", None)])
def test_the_cuda_baseline_is_fa2_on_its_own_pages(monkeypatch, page, want_name, want_page):
    """On CUDA the baseline decodes through FA2 itself: on the candidate's pages when FA2 takes them (256), else on
    the cache re-laid in pages of 256 by the e2e run (never FA2-paged's own re-lay of a 16-token table it is not
    handed: H200, 2026-12-05, the 70B-TP8 shape in pages of 16 failed so)."""
    import kopt.baselines as baselines
    from kopt import workloads
    from kopt.e2e import runner

    monkeypatch.setattr(baselines, "flash_attn_version", lambda: "2.8.3")
    m = workloads.load().model("llama-3.1-70b-tp8")
    case = workloads.custom_case(m, 2, "40", page, "bf16")
    name, _, own = runner._baseline(case, "cuda", page)
    assert (name, own) == (want_name, want_page)


# ---------------------------------------------------------------- the fitted decoder (--fit-steps)

def test_a_fitted_runs_prompt_repeats_one_block_and_its_continuation_follows_the_block():
    from kopt.e2e import fit

    assert fit.period(1536) == fit.PERIOD and fit.period(32) == 16 and fit.period(3) == 2
    g = torch.Generator().manual_seed(0)
    per = fit.period(40)
    p = fit.prompt(3, 40, per, 32000, g, "cpu")
    assert per == 20 and p.shape == (3, 40) and int(p.max()) < fit.BLOCK_VOCAB
    assert torch.equal(p[:, 20:], p[:, :20])
    assert not torch.equal(p[0, :20], p[1, :20]), "each sequence its own block"
    cont = fit.continuation(p, 5)  # step t decodes the token at position 40 + t + 1
    assert cont.shape == (5, 3)
    for t in range(5):
        assert torch.equal(cont[t], p[:, (41 + t) % 20])


@needs_transformers
def test_the_fitted_tiny_decoder_copies_its_block_and_the_candidate_keeps_every_token(tmp_path):
    out = tmp_path / "e2e.jsonl"
    res = kopt("e2e", "--model", "tinyllama-1.1b", "--device", "cpu", "--page-size", "16", "--fit-steps", "400",
               "--candidate", SHIPPED, "--machine", "--no-record", "--out", out)
    assert res.exit_code == 0, (res.stdout, res.stderr)
    f = parse_line(res.stdout.strip().splitlines()[-1])
    assert f["E2E"] == "pass" and f["TOKENS_SAME"] == "8/8" and f["BASE_TOKENS_SAME_FP32"] == "8/8"
    assert f["COPIED"] == "8/8", "the fitted decoder continues the prompt's block through the candidate's attention"
    assert f["FIT_COPY"] == "1.0000", "cast to bf16, it still copies every decoded position, teacher-forced"
    r = E2EResult.model_validate_json(out.read_text())
    from kopt.e2e import fit

    assert r.options.fit_steps == 400 and 0 < r.fit_steps_taken < 400, "it stops once the copy is learned"
    assert r.fit_loss < fit.DONE_LOSS * 2 and f["FIT_STEPS"] == str(r.fit_steps_taken)


@needs_transformers
def test_a_second_run_of_the_same_fit_loads_the_kept_decoder(tmp_path, monkeypatch):
    """The fit cache: the same fit (sizes, seed, steps, lengths) loads the kept weights and how the fit went, and the
    decoder is the one the fit made; another step count fits again; KOPT_FIT_CACHE=0 keeps nothing."""
    from kopt.e2e import fit, llama

    d = llama.dims(32, 4, 64, 2, tiny=True)

    def build(steps):
        return llama.build(d, 128, torch.float32, "cpu", 0, steps, 40, 16)

    first = build(30)
    kept = list((tmp_path / "fits").glob("*.pt"))
    assert len(kept) == 1 and not first.fitted.cached and first.fitted.steps == 30
    again = build(30)
    assert again.fitted.cached and (again.fitted.steps, again.fitted.trace) == (first.fitted.steps, first.fitted.trace)
    a, b = first.lm.state_dict(), again.lm.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert first.fitted.copy_acc is not None and again.fitted.copy_acc == first.fitted.copy_acc, "measured each run"
    assert not build(31).fitted.cached and len(list((tmp_path / "fits").glob("*.pt"))) == 2
    kept[0].write_bytes(b"not a checkpoint")  # a broken file is a miss: the run fits again (and keeps the new one)
    assert not build(30).fitted.cached and build(30).fitted.cached
    monkeypatch.setenv("KOPT_FIT_CACHE", "0")
    assert fit.cache_file({"a": 1}) is None and not build(32).fitted.cached
    assert len(list((tmp_path / "fits").glob("*.pt"))) == 2


@needs_transformers
def test_copy_accuracy_is_near_chance_for_an_unfitted_decoder():
    """fit.copy_accuracy can fail: a random decoder predicts the block's next token about one time in BLOCK_VOCAB."""
    from kopt.e2e import fit, llama

    lm = llama.build(llama.dims(32, 4, 64, 2, tiny=True), 128, torch.bfloat16, "cpu", 0).lm
    acc = fit.copy_accuracy(lm, 64, 16, 16, 0, "cpu")
    assert 0.0 <= acc < 0.1
    assert lm.config._attn_implementation != "sdpa", "the decoder's own attention is restored"
