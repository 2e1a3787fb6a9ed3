"""One e2e run in this process: build the decoder, prefill, decode with the baseline and with the candidate (each
its own cache in its own layout, from the same prefill), an fp32-attention run and the step without attention,
then judge. Runs in the e2e child (kopt.e2e.child); `kopt.e2e.run` is the parent's call."""

from __future__ import annotations

import time
from pathlib import Path

from kopt.e2e import check, decode, fit, kvcache, llama
from kopt.e2e.models import E2EOptions, E2EResult, check_context
from kopt.errors import CandidateLoadError
from kopt.records import Status

_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}
#: Positions past prompt + tokens: the steps replayed for the profiler (one warm, two profiled) write there.
_SPARE = 8


def _baseline(case, device: str, page: int | None):
    """(name, decode function, cache page) of the baseline in the candidate's place: flash_attn_with_kvcache on CUDA
    (the candidate's pages when they are a multiple of 256, else pages of 256, as a serving engine running it lays
    its cache), torch on a CPU (over a contiguous cache)."""
    from kopt.baselines import FA2_PAGE, pick
    from kopt.workload import Workload

    b = pick(case.with_variant(page_size=0), device)  # 0: contiguous (None would keep the case's pages)
    own = page if page and page % FA2_PAGE == 0 else FA2_PAGE if page and b.name.startswith("flash_attn") else None
    name = b.name + (f"-paged{own}" if own and own != page else "")

    def fn(q, k, v, seqlens, table, scale):
        return b.fn(Workload(q, k, v, seqlens, table, scale, 0))

    return name, fn, own


def _candidate(path: Path):
    from kopt import candidate

    mod = candidate.load(path)

    def fn(q, k, v, seqlens, table, scale):
        return mod.run(q, k, v, seqlens, block_table=table, softmax_scale=scale)

    return mod, fn


def _first_call(fn, store: kvcache.Store, q_shape, dtype, scale, who: str = "candidate") -> float:
    """One standalone call on the store (compiles where the kernel compiles on first use); its seconds."""
    import torch

    q = torch.randn(q_shape, dtype=dtype, device=store.pos.device)
    store.seqlens.copy_(store.pos)
    t0 = time.perf_counter()
    try:
        fn(q, store.k[0], store.v[0], store.seqlens, store.block_table, scale)
    except Exception as e:
        name = "run" if who == "candidate" else f"the {who}"
        raise kvcache.CandidateFailure(f"first call (compile) of {name} raised {kvcache.one_line(e)}", who) from None
    if store.pos.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def _share(null, step):
    """1 - null step / step; None when either is missing or the step was not slower than the null step (the
    noise of a busy host hides the attention: not measured, never 0)."""
    if not (null and step) or null.median_ms >= step.median_ms:
        return None
    return 1 - null.median_ms / step.median_ms


def run(path: Path, o: E2EOptions) -> E2EResult:
    """The e2e run of the candidate at path (module docstring); a usage error or CandidateFailure stops it."""
    import torch

    from kopt import candidate, workloads
    from kopt.hardware import detect
    from kopt.paths import recorded

    t_start = time.perf_counter()
    m = workloads.load().model(o.model)
    check_context(o, m.max_context)
    res = E2EResult(options=o, candidate_id=candidate.candidate_id(path), candidate_path=recorded(path),
                    transformers=llama.transformers_version(), device=detect(o.device).name)
    if o.device == "cpu":
        torch.set_num_threads(1)  # the tiny decoder's small ops: intra-op threads only add stalls on a busy host
    dtype = getattr(torch, _DTYPES[o.dtype])
    d = llama.dims(m.q_heads, m.kv_heads, m.head_dim, o.layers, tiny=o.device == "cpu")
    res.dims = d
    try:
        mod, cand = _candidate(path)
        res.backend = candidate.backend_of(mod)
        per = fit.period(o.prompt_len)
        built = llama.build(d, m.max_context, dtype, o.device, o.seed, o.fit_steps, o.prompt_len + o.tokens, per,
                            o.tokens)
        if built.fitted:
            res.fit_loss, res.fit_steps_taken = built.fitted.loss_last, built.fitted.steps
            res.fit_trace, res.fit_cached = built.fitted.trace, built.fitted.cached
            res.fit_copy = built.fitted.copy_acc
        with torch.inference_mode():
            case = workloads.custom_case(m, o.batch, str(o.prompt_len + o.tokens), o.page_size, o.dtype)
            res.ref, base, base_page = _baseline(case, o.device, o.page_size)
            _decode_all(res, built.lm, m, o, dtype, cand, base, base_page)
    except (CandidateLoadError, kvcache.CandidateFailure) as e:
        who = getattr(e, "who", "candidate")
        res.passed, res.error_kind, res.message = False, "candidate" if who == "candidate" else "baseline", str(e)
        res.status = Status.compile_error if isinstance(e, CandidateLoadError) else Status.runtime_error \
            if who == "candidate" else Status.baseline_error
    res.wall_s = time.perf_counter() - t_start
    return res


def _decode_all(res: E2EResult, lm, m, o: E2EOptions, dtype, cand, base, base_page) -> None:
    import torch

    cap = o.prompt_len + o.tokens + _SPARE
    master = kvcache.empty_store(o.layers, o.batch, cap, m.kv_heads, m.head_dim, dtype, o.device)
    g = torch.Generator(device="cpu").manual_seed(o.seed + 1)
    if o.fit_steps:  # the task the decoder was fitted to: a repeated block
        prompt = fit.prompt(o.batch, o.prompt_len, fit.period(o.prompt_len), lm.config.vocab_size, g, o.device)
    else:
        prompt = torch.randint(0, lm.config.vocab_size, (o.batch, o.prompt_len), generator=g).to(o.device)
    first = decode.prefill(lm, master, prompt)
    scale, q_shape = m.head_dim ** -0.5, (o.batch, 1, m.q_heads, m.head_dim)
    graph = o.graph and o.device == "cuda"
    n, layers = o.tokens, o.layers

    def stepper(fn, page, use_graph=graph, who="candidate"):
        st = kvcache.relaid(master, page, o.seed)
        return decode.Stepper(lm, st, fn, use_graph, who)

    sb = stepper(base, base_page, who="baseline")
    _first_call(base, sb.store, q_shape, dtype, scale, "baseline")
    b = sb.run(first, n)
    res.ref_timing = decode.timing(b.times_ms, o.warmup, sb.method)

    cs_store = kvcache.relaid(master, o.page_size, o.seed)
    res.compile_s = _first_call(cand, cs_store, q_shape, dtype, scale)
    kvcache.ACTIVE.calls = 0
    sc = decode.Stepper(lm, cs_store, cand, graph)
    c = sc.run(first, n)
    calls = sc.captured_calls if sc.graph is not None else kvcache.ACTIVE.calls / n
    res.calls = int(sc.captured_calls if sc.graph is not None else kvcache.ACTIVE.calls)
    res.timing = decode.timing(c.times_ms, o.warmup, sc.method)

    f = stepper(kvcache.fp32_attention, None, False, "reference").run(first, n, forced=b.tokens)
    free = stepper(kvcache.fp32_attention, None, False, "reference").run(first, n)  # its own tokens
    base_parted = check.first_parting(b.tokens, free.tokens)
    res.base_tokens_same_fp32 = n if base_parted is None else base_parted
    parted = check.first_parting(b.tokens, c.tokens)
    if o.fit_steps:
        gone = check.first_parting(fit.continuation(prompt, n), c.tokens)
        res.copied = n if gone is None else gone
    cand_logits = c.logits
    margin = None
    if parted is not None:  # the candidate fed the baseline's tokens: every step comparable
        cand_logits = stepper(cand, o.page_size, False).run(first, n, forced=b.tokens).logits
        margin = check.tie_margin(b.logits[parted], b.tokens[parted], c.tokens[parted])
    bad = (~torch.isfinite(cand_logits)).flatten(1).any(1).nonzero()
    res.steps = check.step_gaps(b.logits, cand_logits, f.logits, parted, dtype)
    res.tokens_same = n if parted is None else parted
    res.max_logit_diff = max(s.vs_base for s in res.steps)
    res.max_logit_diff_fp32 = max(s.vs_fp32 for s in res.steps)
    res.base_logit_diff_fp32 = max(s.base_vs_fp32 for s in res.steps)

    sn = stepper(kvcache.no_attention, o.page_size, who="reference")
    res.null_timing = decode.timing(sn.run(first, n).times_ms, o.warmup, sn.method)
    if res.timing and res.ref_timing:
        res.step_speedup = res.ref_timing.median_ms / res.timing.median_ms
    res.attn_share, res.ref_attn_share = _share(res.null_timing, res.timing), _share(res.null_timing, res.ref_timing)
    if sc.graph is not None:
        q = torch.randn(q_shape, dtype=dtype, device=o.device)
        res.kernels_seen, res.kernels = check.kernels_seen(
            sc.graph.replay, sn.graph.replay if sn.graph else lambda: sn.step(0),
            lambda: cand(q, sc.store.k[0], sc.store.v[0], sc.store.seqlens, sc.store.block_table, scale),
            lambda: base(q, sb.store.k[0], sb.store.v[0], sb.store.seqlens, sb.store.block_table, scale), layers)
    calls_bad = None if calls == layers else (f"the model called the candidate's run {calls:g} times per decode step, "
                                              f"want {layers} (one per layer)")
    j = check.judge(res.steps, int(bad[0]) if bad.numel() else None, parted, margin, calls_bad, res.kernels_seen, n)
    res.passed, res.status, res.message = j.passed, j.status, j.message
