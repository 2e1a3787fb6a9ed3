"""The shipped kernel on CUDA: the correctness matrix of the kernel issue (gpu marker; skipped without CUDA).

14 cases x fp16/bf16 x contiguous/paged 16/64/256, plus ragged lengths, head dim 64, MHA and MQA shapes;
each output against the fp32 reference with kopt's own tolerance rule (2 x the torch baseline's error + floor).
"""

import pytest

from conftest import SHIPPED, combine_rows_needed

CASE_IDS = list(range(1, 15))


@pytest.fixture(scope="module")
def kernel():
    from kopt import candidate

    return candidate.load(SHIPPED)


def _intact(case, seed):
    """A CUDA workload with its fp32 reference and torch baseline, taken before a test alters its inputs."""
    from kopt import baselines
    from kopt.reference import reference
    from kopt.workload import make_workload

    w = make_workload(case, seed, "cuda")
    return w, reference(w), baselines.torch_attention(w)


def _assert_ok(kernel, w, ref, base, config, what):
    """One call of the kernel on w checked against ref with kopt's tolerance rule (base: the torch baseline)."""
    import torch

    from kopt.eval import checks

    out = kernel.run(*w.args(), **w.kwargs(config))
    torch.cuda.synchronize()
    chk = checks.check_output(out, ref, base, w.q)
    assert chk.status.value == "ok", f"{what}: {chk.detail}"


def _check(kernel, case, seed=0, config=None):
    _assert_ok(kernel, *_intact(case, seed), config, f"case {case.id} {case.variant.label()}")


def _case(i, **variant):
    from kopt.cases import load_cases, select

    return select(load_cases(), [i])[0].with_variant(**variant)


def _check_garbage_past_the_sequence(kernel, cid, page, seed, config, what, dtype="fp16", update=None):
    """Case cid with ragged lengths (at least three rows, one of them full) in pages whose block-table entries past
    each sequence hold garbage (negative ids, ids past the pool), against the reference of the intact table.
    ``update``: fields of the case to replace (batch, seqlen_k)."""
    import torch

    c = _case(cid, seqlens="ragged", dtype=dtype, page_size=page)
    # one sequence stays full: others must be shorter
    c = c.model_copy(update={"batch": max(c.batch, 3), **(update or {})})
    w, ref, base = _intact(c, seed)  # from the intact table
    bt, nblocks = w.block_table, w.k_cache.shape[0]
    used = (w.cache_seqlens.long() + page - 1) // page
    cols = torch.arange(bt.shape[1], device=bt.device)
    past = cols[None, :] >= used[:, None]
    garbage = torch.where(cols % 2 == 0, -7, nblocks + 1000).to(bt.dtype).expand_as(bt)
    bt.copy_(torch.where(past, garbage, bt))
    assert bool(past.any()), "no entry past a sequence: the test would prove nothing"
    _assert_ok(kernel, w, ref, base, config, what)


def _check_switch(kernel, cid, seqlens, page, cfg, key, seed, garbage=False):
    """A plan switch `key` set in cfg (None: the plan's own rule): the plan takes it (plan_info), then case cid runs
    right in fp16 and bf16 (seeds seed, seed + 1) and head dim 64 (seed + 2); with garbage, also with garbage table
    entries past each sequence (seed + 3). Returns the fp16 plan."""
    from kopt.workload import make_workload

    w0 = make_workload(_case(cid, seqlens=seqlens, page_size=page), 0, "cuda")
    plan = kernel.plan_info(*w0.args(), **w0.kwargs(cfg))
    assert key is None or plan[key] == bool(cfg[key]), "the plan ignored it"
    for s, dtype in ((seed, "fp16"), (seed + 1, "bf16")):
        _check(kernel, _case(cid, seqlens=seqlens, dtype=dtype, page_size=page), seed=s, config=cfg)
    _check(kernel, _case(cid, seqlens=seqlens, head_dim=64, page_size=page), seed=seed + 2, config=cfg)
    if garbage:
        _check_garbage_past_the_sequence(kernel, cid, page, seed + 3, cfg, f"case {cid} page {page} {key} garbage")
    return plan


@pytest.mark.gpu
@pytest.mark.parametrize("page", [None, 16, 64, 256], ids=["contig", "p16", "p64", "p256"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("cid", CASE_IDS)
def test_fourteen_cases(kernel, cid, dtype, page):
    _check(kernel, _case(cid, dtype=dtype, page_size=page or 0))


@pytest.mark.gpu
@pytest.mark.parametrize("cid", [3, 5, 8, 10, 12, 14])
@pytest.mark.parametrize("page", [None, 64])
def test_ragged(kernel, cid, page):
    _check(kernel, _case(cid, seqlens="ragged", page_size=page or 0), seed=7)


@pytest.mark.gpu
@pytest.mark.parametrize("cid", [1, 4, 10, 13])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_head_dim_64(kernel, cid, dtype):
    _check(kernel, _case(cid, head_dim=64, dtype=dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("kv_heads,gqa", [(32, 1), (8, 1), (1, 32), (1, 8), (2, 16)], ids=["MHA32", "MHA8", "MQA32",
                                                                                           "MQA8", "G16"])
@pytest.mark.parametrize("page", [None, 256])
def test_mha_mqa(kernel, kv_heads, gqa, page):
    c = _case(10, page_size=page or 0, seqlens="ragged")
    c = c.model_copy(update={"kv_heads": kv_heads, "gqa": gqa, "batch": 3, "seqlen_k": 3001})
    _check(kernel, c, seed=3)


@pytest.mark.gpu
@pytest.mark.parametrize("eager", [0, 1])
@pytest.mark.parametrize("cid,seqlens,splits", [(1, "full", 0), (3, "ragged", 0), (5, "full", 0), (8, "ragged", 0),
                                                (10, "ragged", 0), (10, "ragged", 64), (13, "ragged", 0),
                                                (14, "full", 0), (6, "ragged", 4)])
def test_eager_first_tile(kernel, cid, seqlens, splits, eager):
    """The eager variant (first K tile and Q issued before L[b] arrives, split ranges from the allocated
    length) on full and ragged lengths, with splits that lie wholly past a short sequence."""
    cfg = {"eager": eager, "num_splits": splits} if splits else {"eager": eager}
    for dtype in ("fp16", "bf16"):
        _check(kernel, _case(cid, seqlens=seqlens, dtype=dtype), seed=11, config=cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("eager", [0, 1])
@pytest.mark.parametrize("cid,page,splits", [(10, 64, 0), (10, 256, 0), (8, 16, 8), (3, 16, 0), (5, 64, 0),
                                             (13, 256, 0), (6, 64, 4)])
def test_paged_with_garbage_past_the_sequence(kernel, cid, page, splits, eager):
    """Paged caches whose block-table entries past each sequence hold garbage (negative ids, ids past the
    pool): the eager variant reads its first K tile from such entries before L[b] arrives (page ids are
    clamped into the pool, the keys masked), and neither variant may let them reach the output."""
    cfg = {"eager": eager} | ({"num_splits": splits} if splits else {})
    for seed, dtype in ((31, "fp16"), (32, "bf16")):
        _check_garbage_past_the_sequence(kernel, cid, page, seed, cfg, f"case {cid} page {page} eager {eager} {dtype}",
                                         dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("cid,page,seqlens,cfg", [
    (15, 16, "full", None), (16, 256, "full", None), (17, 32, "full", None), (18, 64, "full", None),
    (16, 16, "full", {"block_N": 128}), (8, 256, "ragged", {"num_splits": 8, "block_N": 128, "eager": 0}),
    (10, 16, "ragged", {"eager": 0}), (5, 16, "ragged", {"eager": 0, "block_N": 32}),
    (7, 64, "ragged", {"eager": 0}), (3, 16, "full", {"eager": 0, "block_N": 32}),
    (5, 64, "ragged", {"eager": 0, "block_N": 160}), (10, 16, "ragged", {"eager": 1})])
def test_tile_page(kernel, cid, page, seqlens, cfg):
    """A row's page from its tile's first page (tile_page: the plan's rule wherever it can run) and each row's own page
    (elsewhere: tiles ending inside a page, eager plans): balanced, plain split and unsplit plans, tiles of several
    pages (16-token pages), pages of several tiles (256) and one tile a page (64), sequences ending inside a page, in
    both dtypes and head dims; then the same plans with garbage table entries past each sequence."""
    import sys

    p = _check_switch(kernel, cid, seqlens, page, cfg or {}, None, 95, garbage=True)
    applies = sys.modules["tl_decode_cuda"].tile_page_applies(True, page, p["block_N"], p["eager"])
    assert p["tile_page"] == applies


@pytest.mark.gpu
@pytest.mark.parametrize("eager", [0, 1])
@pytest.mark.parametrize("cid,page,block_N", [(4, 0, 0), (3, 0, 0), (5, 0, 0), (5, 0, 64), (5, 0, 192), (3, 0, 64),
                                              (6, 0, 0), (10, 0, 192), (3, 16, 0), (5, 64, 0), (4, 256, 0), (18, 0, 0),
                                              (17, 16, 0), (16, 32, 0)])
def test_nan_past_the_sequence_stays_out(kernel, cid, page, block_N, eager):
    """K and V rows past each sequence hold NaN (stale or never written cache rows): the eager loads read K
    rows there before L[b] arrives, and every path must keep them out of the output (P = 0 times NaN is NaN). R2 in
    32-token pages is iteration 57's balanced plan of rows that fill the units (with eager 1: the direct kernel)."""
    cfg = {"eager": eager} | ({"block_N": block_N} if block_N else {})
    c = _case(cid, seqlens="ragged", page_size=page)
    c = c.model_copy(update={"batch": max(c.batch, 3)})
    w, ref, base = _intact(c, 41)  # from the intact cache
    _nan_past_the_sequence(w, page)
    _assert_ok(kernel, w, ref, base, cfg, f"case {cid} page {page} block_N {block_N} eager {eager}")


def _nan_past_the_sequence(w, page):
    """NaN in every K and V row past each sequence of w (pages: through its block table)."""
    import torch

    lens = w.cache_seqlens.long()
    for cache in (w.k_cache, w.v_cache):
        if page:  # position p of sequence b lives in page block_table[b, p // page], row p % page
            pos = torch.arange(w.block_table.shape[1] * page, device=cache.device)
            for b in range(w.q.shape[0]):
                past = pos[pos >= lens[b]]
                cache[w.block_table[b, past // page].long(), past % page] = float("nan")
        else:
            pos = torch.arange(cache.shape[1], device=cache.device)
            cache[pos[None, :].expand(cache.shape[0], -1) >= lens[:, None]] = float("nan")
    assert bool(torch.isnan(w.v_cache).any()), "no row past a sequence: the test would prove nothing"


def _check_nan_past_short_rows(kernel, case, page, seed, want: dict, short: str, what: str):
    """Case `case` (ragged lengths) under its own plan, which has the fields `want`, with a row shorter than 64 keys
    (`short` names the test's reason to need one) and NaN in every K and V row past each sequence: the output is the
    reference's."""
    w, ref, base = _intact(case, seed)
    plan = kernel.plan_info(*w.args(), **w.kwargs(None))
    assert {k: plan[k] for k in want} == want, plan
    assert int(w.cache_seqlens.min()) < 64, f"{short}: the test would prove less"
    _nan_past_the_sequence(w, page)
    _assert_ok(kernel, w, ref, base, None, what)


@pytest.mark.gpu
@pytest.mark.parametrize("page,head_dim,dtype", [(16, 128, "fp16"), (32, 64, "bf16"), (64, 128, "bf16"),
                                                  (256, 128, "fp16"), (256, 64, "fp16")])
def test_k_clamp_on_busy_paged_grids(kernel, page, head_dim, dtype):
    """k_clamp (an eager paged first K tile's row offsets from L[b], on grids of more than BUSY_CTAS_PER_UNIT CTAs a
    unit): case 4's heads, as many rows as the device has units (8 kv heads: 8 CTAs a unit), two pages of cache a
    row (at least 64 keys: 1-8 tiles, eager), ragged lengths, NaN in every K and V row past each sequence, then
    garbage table entries past each sequence."""
    import torch

    units = torch.cuda.get_device_properties(0).multi_processor_count
    update = {"batch": units, "seqlen_k": max(64, 2 * page)}
    c = _case(4, seqlens="ragged", page_size=page, head_dim=head_dim, dtype=dtype).model_copy(update=update)
    _check_nan_past_short_rows(kernel, c, page, 72, {"kernel": "decode_direct", "eager": True, "k_clamp": True},
                               "no row shorter than its first tile",
                               f"page {page} d {head_dim} {dtype} NaN past the sequence")
    _check_garbage_past_the_sequence(kernel, 4, page, 73, None, f"page {page} garbage", dtype, update)


@pytest.mark.gpu
@pytest.mark.parametrize("page,dtype", [(0, "fp16"), (256, "bf16"), (16, "fp16"), (64, "bf16")])
def test_balanced_combine_finds_its_rows(kernel, page, dtype):
    """The balanced plan's combine kernel runs one CTA a (query head, row that needs it) (combine_rows), each finding
    its row by a prefix scan of the rows' flags: 300 rows of 16 query heads on one kv head (three rounds of the
    scan), 8 rows of 32768 keys scattered over the rounds among rows of 1-200 keys. The plan is balanced with a
    combine kernel, several rows need it (more than LAST_CTA_MAX_ROWS partial rows), and every row is the
    reference's."""
    import random
    import sys

    rng = random.Random(page)
    long_rows = {5, 100, 127, 128, 200, 255, 256, 299}
    lengths = [32768 if i in long_rows else rng.randint(1, 200) for i in range(300)]
    c = _case(17, dtype=dtype, page_size=page or None).model_copy(
        update={"batch": 300, "seqlen_k": 32768, "kv_heads": 1, "gqa": 16, "lengths": lengths})
    w, ref, base = _intact(c, 91)
    plan = kernel.plan_info(*w.args(), **w.kwargs(None))
    assert plan["kernel"] == "decode_balanced" and not plan["last_cta"], plan
    cu = sys.modules["tl_decode_cuda"]
    bn, target, G = plan["block_N"], plan["balanced"], 16
    need = combine_rows_needed(cu, [-(-n // bn) for n in lengths], 1, target, G, plan["num_splits"])
    assert len(need) >= 2 and len({i // 128 for i in need}) >= 2, (need, plan)
    assert len(need) <= cu.combine_rows(target, 1, G) < 300
    assert w.cache_seqlens.tolist() == lengths
    _assert_ok(kernel, w, ref, base, None, f"page {page} {dtype}: rows {need} in the combine kernel")


@pytest.mark.gpu
@pytest.mark.parametrize("seqlen,page,head_dim,block_N", [(90, 0, 128, 96), (100, 16, 128, 128), (120, 32, 64, 128),
                                                          (80, 16, 64, 96), (110, 0, 64, 128)])
def test_one_tile_short_ranges(kernel, seqlen, page, head_dim, block_N):
    """Iteration 58: case 5's 64 rows with 65-128 allocated keys run as one tile of 96 or 128 keys (the plan says so),
    eager, so a row shorter than the tile reads K rows past its sequence before its length arrives: with NaN there
    and ragged lengths (some under 64 keys), the output is the reference's."""
    c = _case(5, seqlens="ragged", page_size=page or None, head_dim=head_dim)
    c = c.model_copy(update={"seqlen_k": seqlen})
    _check_nan_past_short_rows(kernel, c, page, 58, {"kernel": "decode_direct", "block_N": block_N, "eager": True},
                               "no row shorter than two 64-key tiles", f"seqlen {seqlen} page {page} d {head_dim}")


@pytest.mark.gpu
@pytest.mark.parametrize("v_split", [1, 2])
@pytest.mark.parametrize("cid,page,seqlens,eager", [(1, 0, "full", 1), (5, 0, "ragged", 1), (5, 0, "full", 0),
                                                    (5, 16, "ragged", 1), (3, 256, "ragged", 1), (2, 64, "full", 0),
                                                    (6, 0, "ragged", 1), (4, 32, "ragged", 0)])
def test_v_split(kernel, cid, page, seqlens, eager, v_split):
    """A row's V and output columns over two CTAs (each with the whole softmax from all of K) or one, in every
    layout, both dtypes and head dims 64 and 128, eager or not, on full and ragged lengths."""
    cfg = {"v_split": v_split, "eager": eager}
    for dtype in ("fp16", "bf16"):
        c = _case(cid, seqlens=seqlens, dtype=dtype, page_size=page or None)
        _check(kernel, c, seed=13, config=cfg)
        _check(kernel, c.with_variant(head_dim=64), seed=14, config=cfg)
    for kv_heads, gqa in ((8, 1), (1, 32)):  # MHA, MQA
        c = _case(cid, seqlens=seqlens).model_copy(update={"kv_heads": kv_heads, "gqa": gqa})
        _check(kernel, c, seed=15, config=cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("cid,page,seqlens", [(1, 0, "full"), (5, 16, "ragged"), (10, 0, "ragged"), (14, 256, "full"),
                                              (15, 16, "full"), (18, 0, "full"), (8, 64, "ragged")])
def test_fast_math(kernel, cid, page, seqlens):
    """The kernels built with nvcc's fast math (approximate division, denormals flushed: the plan's rule on CUDA),
    unsplit, split with a combine kernel or a last-CTA merge, balanced, in both dtypes and head dims: each within
    kopt's tolerance."""
    from kopt.workload import make_workload

    w = make_workload(_case(cid, seqlens=seqlens, page_size=page or None), 0, "cuda")
    assert kernel.plan_info(*w.args(), **w.kwargs())["fast_math"] is True
    cfg = None
    for dtype in ("fp16", "bf16"):
        c = _case(cid, seqlens=seqlens, dtype=dtype, page_size=page or None)
        _check(kernel, c, seed=81, config=cfg)
    _check(kernel, _case(cid, seqlens=seqlens, head_dim=64, page_size=page or None), seed=82, config=cfg)


@pytest.mark.gpu
def test_v_split_needs_an_unsplit_plan(kernel):
    """v_split 2 on a split plan is a ValueError naming the key, not a silent one-CTA plan."""
    from kopt.workload import make_workload

    w = make_workload(_case(10), 0, "cuda")
    with pytest.raises(ValueError, match="v_split"):
        kernel.run(*w.args(), **w.kwargs({"v_split": 2, "num_splits": 4}))
    with pytest.raises(ValueError, match="v_split"):
        kernel.run(*w.args(), **w.kwargs({"v_split": 3, "num_splits": 1}))


@pytest.mark.gpu
@pytest.mark.parametrize("kv_heads,gqa", [(32, 1), (1, 32), (2, 16)], ids=["MHA32", "MQA32", "G16"])
def test_eager_head_layouts(kernel, kv_heads, gqa):
    c = _case(10, seqlens="ragged").model_copy(update={"kv_heads": kv_heads, "gqa": gqa, "batch": 3, "seqlen_k": 3001})
    _check(kernel, c, seed=5, config={"eager": 1})
    _check(kernel, c.with_variant(head_dim=64), seed=5, config={"eager": 1})


@pytest.mark.gpu
@pytest.mark.parametrize("eager", [0, 1])
@pytest.mark.parametrize("cid,seqlens,splits,page", [(10, "full", 0, 0), (10, "ragged", 64, 0), (13, "full", 0, 0),
                                                     (14, "ragged", 0, 256), (8, "ragged", 8, 16), (6, "ragged", 4, 0),
                                                     (12, "full", 128, 64)])
def test_last_cta_merge(kernel, cid, seqlens, splits, page, eager):
    """The in-kernel merge by the last CTA of each (batch, kv head): split shapes, empty splits past short
    sequences, paged caches; three calls in a row with fresh inputs: the two fp16 calls share one plan's
    arrival counters (the first call's merging CTAs must have reset them), the bf16 call has its own."""
    cfg = {"last_cta": 1, "eager": eager} | ({"num_splits": splits} if splits else {})
    for seed, dtype in ((21, "fp16"), (22, "bf16"), (23, "fp16")):
        _check(kernel, _case(cid, seqlens=seqlens, dtype=dtype, page_size=page), seed=seed, config=cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("kv_heads,gqa", [(32, 1), (1, 32), (2, 16)], ids=["MHA32", "MQA32", "G16"])
def test_last_cta_head_layouts(kernel, kv_heads, gqa):
    c = _case(10, seqlens="ragged").model_copy(update={"kv_heads": kv_heads, "gqa": gqa, "batch": 3, "seqlen_k": 3001})
    for cfg in ({"last_cta": 1, "num_splits": 16}, {"last_cta": 1, "eager": 1, "num_splits": 7}):
        _check(kernel, c, seed=5, config=cfg)
        _check(kernel, c.with_variant(head_dim=64), seed=6, config=cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("cid,seqlens,page,cfg,unroll", [
    (10, "ragged", 0, {"num_splits": 40, "last_cta": 0}, 0), (13, "full", 64, {"num_splits": 33, "last_cta": 0}, 0),
    (13, "full", 0, {"num_splits": 48, "last_cta": 0}, 64), (14, "ragged", 0, {"num_splits": 100, "last_cta": 0}, 64),
    (14, "full", 0, {}, 64), (17, "full", 0, {}, 0), (18, "full", 16, {}, 64), (17, "full", 256, {}, 64)])
def test_combine_chunks(kernel, cid, seqlens, page, cfg, unroll):
    """The combine kernel (its LSE values through shared memory) in chunks of 32 splits below 48 splits and of 64 from
    48 on (comb_unroll_default): one chunk, several with a last one part empty, on plain and balanced split plans, both
    dtypes and head dims."""
    p = _check_switch(kernel, cid, seqlens, page, cfg, None, 63)
    assert p["last_cta"] is False and p["comb_unroll"] == unroll, p


@pytest.mark.gpu
@pytest.mark.parametrize("cid,seqlens,page,cfg", [
    (18, "full", 16, {}), (18, "full", 256, {}), (18, "full", 0, {}), (17, "full", 16, {}), (15, "full", 0, {}),
    (16, "full", 64, {}), (13, "full", 0, {}), (14, "ragged", 0, {"eager": 0}), (8, "ragged", 256, {"num_splits": 7}),
    (5, "ragged", 0, {"eager": 0, "num_splits": 3}), (3, "ragged", 16, {"eager": 0, "num_splits": 4, "block_N": 32})])
def test_even_split(kernel, cid, seqlens, page, cfg):
    """even_split: split ranges that differ by at most one tile, on balanced plans (idle pool blocks, rows of one
    split), plain split plans of more splits than some rows' tiles (empty ranges) and unsplit ones, contiguous and
    paged, both dtypes and head dims; then with garbage table entries past each sequence."""
    _check_switch(kernel, cid, seqlens, page, cfg | {"even_split": 1}, "even_split", 66, garbage=bool(page))


@pytest.mark.gpu
def test_bad_gqa_ratio_is_a_value_error(kernel):
    import torch

    q = torch.zeros(1, 1, 6, 128, device="cuda", dtype=torch.float16)
    k = torch.zeros(1, 8, 4, 128, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="multiple"):
        kernel.run(q, k, k, torch.full((1,), 8, dtype=torch.int32, device="cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("cid", CASE_IDS)
def test_tuned_config_in_use(kernel, cid):
    """The committed tuning table for this GPU drives the kernel: for every case with a tuned row,
    the plan the kernel resolves carries that row's block_N / num_splits (and the output is correct)."""
    import sys

    import torch

    from kopt.workload import make_workload

    lookup = sys.modules["tuning_lookup"]  # the candidate's own reader, imported from its folder
    case = _case(cid)
    w = make_workload(case, 0, "cuda")
    cfg = lookup.lookup_for(w.q, w.k_cache, w.block_table, plan_version=kernel.PLAN_VERSION)
    if cfg is None:
        pytest.skip(f"no tuned row for case {cid} on {torch.cuda.get_device_name()} in {lookup.table_path()}")
    plan = kernel.plan_info(*w.args(), **w.kwargs())
    for key in ("block_N", "num_splits"):
        if cfg.get(key):  # 0 means "the heuristic chooses"
            assert plan[key] == int(cfg[key]), (plan, cfg)
    _check(kernel, case)


RAGGED_IDS = [15, 16, 17, 18]


@pytest.mark.gpu
@pytest.mark.parametrize("page", [None, 16, 32, 64, 256], ids=["contig", "p16", "p32", "p64", "p256"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("cid", RAGGED_IDS)
def test_ragged_batches(kernel, cid, dtype, page):
    """The ragged perf cases (one long row among short ones, seeded uniform lengths, a geometric ladder),
    every layout: the work-balanced plan splits each row by its own length."""
    _check(kernel, _case(cid, dtype=dtype, page_size=page or 0))


def _graph_lengths(B, S, seed):
    import torch

    g = torch.Generator().manual_seed(seed)
    one_long = torch.ones(B, dtype=torch.int32)
    one_long[B // 2] = S
    rand = torch.randint(1, S + 1, (B,), generator=g, dtype=torch.int32)
    zero_and_full = torch.where(torch.arange(B) % 2 == 0, 0, S).to(torch.int32)
    return [torch.full((B,), S, dtype=torch.int32), one_long, rand, zero_and_full]


@pytest.mark.gpu
@pytest.mark.parametrize("cid,page,config", [
    (15, 0, None), (18, 256, None), (17, 16, None), (12, 0, None), (16, 0, {"balanced": 1}), (13, 64, None),
    (8, 0, None), (10, 0, None), (18, 0, {"balanced": 1, "last_cta": 1}),
    (17, 64, {"balanced": 1, "block_N": 128}), (17, 32, {"balanced": 1, "last_cta": 0}),
    (8, 16, {"balanced": 1, "bal_per_sm": 3}), (18, 16, {"even_split": 1}),
    (13, 0, {"even_split": 1, "last_cta": 0, "num_splits": 64})],
    ids=["R1", "R4-p256", "R3-p16", "c12", "R2-balanced", "c13-p64", "c8", "c10", "R4-merge-in-kernel",
         "R3-p64-bn128", "R3-p32-combine", "c8-p16-balanced", "R4-p16-even", "c13-even-combine64"])
def test_cuda_graph_replay_with_new_lengths(kernel, cid, page, config):
    """One call captured in a CUDA graph, replayed after cache_seqlens changes in place (all full; one long
    and the rest of length 1; seeded random; empty and full alternating): each replay matches the fp32
    reference, so the launch depends on shapes only and the plan is made on the device from the lengths."""
    import torch

    from kopt import baselines
    from kopt.eval import checks
    from kopt.reference import reference
    from kopt.workload import make_workload

    w = make_workload(_case(cid, page_size=page), 0, "cuda")
    kw = w.kwargs(config)
    out = kernel.run(*w.args(), **kw)  # compile and plan outside the capture
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        kernel.run(*w.args(), **kw)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernel.run(*w.args(), **kw)
    B, S = w.q.shape[0], _case(cid).seqlen_k
    for i, lens in enumerate(_graph_lengths(B, S, seed=cid)):
        w.cache_seqlens.copy_(lens.to(w.cache_seqlens.device))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = reference(w)
        base = baselines.torch_attention(w)
        got = out.clone()
        got = torch.where(w.cache_seqlens.view(-1, 1, 1, 1) == 0, torch.zeros_like(got), got)  # L = 0: any finite
        ref = torch.where(w.cache_seqlens.view(-1, 1, 1, 1).to(ref.device) == 0, torch.zeros_like(ref), ref)
        chk = checks.check_output(got, ref, torch.nan_to_num(base.float()).to(base.dtype), w.q)
        assert chk.status.value == "ok", f"case {cid} page {page} replay {i} lengths {lens.tolist()[:8]}: {chk.detail}"


def _library_cases():
    """Every model of the workload library twice: fp16 short-to-long rows (an unsplit or split plan) and bf16 with
    one 20k-token row among short ones (a balanced plan), each in its own layout, the layouts rotating over the
    models so that every head dim and GQA ratio meets contiguous and paged 16/32/64/256 caches."""
    from kopt import workloads

    layouts = [0, 16, 32, 64, 256]
    out = []
    for i, m in enumerate(workloads.load().models):
        a, b = layouts[i % 5], layouts[(i + 2) % 5]
        out.append(pytest.param(m.name, "1,100,1500,4096", a, "fp16", id=f"{m.name}-fp16-p{a}"))
        out.append(pytest.param(m.name, "20000,5,700", b, "bf16", id=f"{m.name}-bf16-p{b}"))
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("model,lengths,page,dtype", _library_cases())
def test_every_model_of_the_workload_library(kernel, model, lengths, page, dtype):
    """Each model's attention shape (its head dim and GQA ratio) builds and runs right in every layout and dtype:
    the held-out draws come from these models."""
    from kopt import workloads

    m = workloads.load().model(model)
    case = workloads.custom_case(m, len(lengths.split(",")), lengths, page, dtype)
    _check(kernel, case)


@pytest.mark.parametrize("variant", [{}, {"dtype": "bf16", "page_size": 16}, {"head_dim": 64, "page_size": 256}])
def test_the_devices_profile_plans_as_the_device_does(kernel, variant):
    """What prewarm builds with no GPU (build_plan, from this device's hardware.yaml profile) is what a run here
    loads: the profile's device facts are the driver's, and every named case's plan from the profile is the plan
    resolved from the device (the tuning table read by the same name)."""
    import torch

    from kopt import hardware
    from kopt.cases import load_cases

    prof = hardware.match_profile(torch.cuda.get_device_name())
    assert prof is not None, f"no hardware.yaml profile matches {torch.cuda.get_device_name()}"
    here = kernel._dev.from_torch(torch.device("cuda"))
    assert kernel._dev.from_profile(prof.model_dump())._replace(name=here.name) == here
    for c in load_cases():
        shape = c.with_variant(**variant).shape_dict()
        q, k, bt = kernel._meta_call(shape)
        on_device = kernel._plan_fields(kernel._cuda_plan(q, k, bt, None, None, device=here))
        from_profile = {f: v for f, v in kernel.device_plan(shape, prof.model_dump()).items() if f in on_device}
        assert from_profile == on_device, f"case {c.id} {variant}"
