"""CPU tests of the TileLang decode candidate (solution/tilelang/run_kernel.py).

run() on CPU tensors goes through the TileLang C-target kernel; results are compared with an fp32
reference written here in plain torch. The CUDA kernels are lowered and nvcc-compiled for sm_90a
without a GPU (skipped when nvcc is missing).
"""
import importlib.util
import math
import pathlib
import re
import shutil

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
RUN_KERNEL = ROOT / "solution" / "tilelang" / "run_kernel.py"

pytest.importorskip("tilelang")


@pytest.fixture(scope="module")
def rk():
    spec = importlib.util.spec_from_file_location("kopt_tilelang_run_kernel_test", RUN_KERNEL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def reference(q, k, v, lens, block_table=None, scale=None):
    """fp32 attention of one query token over cache_seqlens[b] keys (contiguous or paged cache)."""
    B, _, Hq, D = q.shape
    Hkv = k.shape[2]
    G = Hq // Hkv
    scale = scale if scale is not None else 1.0 / math.sqrt(D)
    out = torch.empty((B, Hq, D), dtype=torch.float32)
    for b in range(B):
        n = int(lens[b])
        if block_table is None:
            kb, vb = k[b, :n], v[b, :n]
        else:
            page = k.shape[1]
            pos = torch.arange(n)
            blk = block_table[b, pos // page].long()
            kb, vb = k[blk, pos % page], v[blk, pos % page]
        kb = kb.float().repeat_interleave(G, dim=1).transpose(0, 1)  # Hq, n, D
        vb = vb.float().repeat_interleave(G, dim=1).transpose(0, 1)
        s = (kb @ q[b, 0].float().unsqueeze(-1)).squeeze(-1) * scale  # Hq, n
        p = torch.softmax(s, dim=-1)
        out[b] = (p.unsqueeze(1) @ vb).squeeze(1)
    return out.view(B, 1, Hq, D)


def make_inputs(B, S, Hkv, G, D, dtype, page=None, ragged=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    Hq = Hkv * G
    q = torch.randn((B, 1, Hq, D), generator=g).to(dtype)
    if ragged:
        lens = torch.randint(1, S + 1, (B,), generator=g, dtype=torch.int32)
        lens[0] = S
    else:
        lens = torch.full((B,), S, dtype=torch.int32)
    if page is None:
        k = torch.randn((B, S, Hkv, D), generator=g).to(dtype)
        v = torch.randn((B, S, Hkv, D), generator=g).to(dtype)
        bt = None
    else:
        mp = -(-S // page)
        nblocks = B * mp + 3  # a few unused pages
        k = torch.randn((nblocks, page, Hkv, D), generator=g).to(dtype)
        v = torch.randn((nblocks, page, Hkv, D), generator=g).to(dtype)
        bt = torch.randperm(nblocks, generator=g)[: B * mp].to(torch.int32).view(B, mp).contiguous()
    return q, k, v, lens, bt


def check(rk, B, S, Hkv, G, D=128, dtype=torch.float16, page=None, ragged=False, tol=2e-2, seed=0):
    q, k, v, lens, bt = make_inputs(B, S, Hkv, G, D, dtype, page, ragged, seed)
    saved = [t.clone() for t in (q, k, v, lens)] + ([bt.clone()] if bt is not None else [])
    out = rk.run(q, k, v, lens, block_table=bt)
    assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device
    for before, after in zip(saved, [q, k, v, lens] + ([bt] if bt is not None else [])):
        assert torch.equal(before, after), "inputs were modified"
    ref = reference(q, k, v, lens, bt)
    err = (out.float() - ref).abs().max().item()
    assert err <= tol, f"max abs err {err:.3e} > {tol}"
    return out


# benchmark shapes (batch, seqlen_k, kv_heads, gqa): edge cases 1-3 and a few mid ones
BENCH = [(1, 1, 4, 8), (4, 2, 8, 4), (16, 17, 4, 8), (16, 141, 4, 8), (16, 362, 8, 4), (1, 8192, 4, 8)]


@pytest.mark.parametrize("shape", BENCH, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_bench_shapes_contiguous(rk, shape, dtype):
    check(rk, *shape, dtype=dtype)


@pytest.mark.parametrize(
    "B,S,Hkv,G,D,dtype,page",
    [
        (4, 2, 8, 4, 128, torch.float16, 16),  # benchmark case 2 shape, paged
        (16, 17, 4, 8, 128, torch.bfloat16, 256),  # benchmark case 3 shape, paged
        (3, 700, 2, 4, 128, torch.float16, 16),  # tiles span several pages
        (2, 1000, 1, 32, 64, torch.float16, 256),  # MQA
        (3, 333, 4, 1, 64, torch.bfloat16, 16),  # MHA
    ],
)
def test_paged_ragged(rk, B, S, Hkv, G, D, dtype, page):
    check(rk, B, S, Hkv, G, D=D, dtype=dtype, page=page, ragged=True)


@pytest.mark.parametrize(
    "B,S,Hkv,G,D,dtype",
    [
        (3, 500, 1, 32, 128, torch.bfloat16),  # MQA Hq=32, Hkv=1
        (2, 129, 1, 64, 64, torch.float16),  # MQA, G=64
        (4, 257, 2, 4, 128, torch.float32),  # fp32 inputs on CPU
    ],
)
def test_ragged_gqa_variants(rk, B, S, Hkv, G, D, dtype):
    check(rk, B, S, Hkv, G, D=D, dtype=dtype, ragged=True, tol=2e-2 if dtype != torch.float32 else 1e-4)


def test_softmax_scale_and_new_output(rk):
    q, k, v, lens, _ = make_inputs(2, 100, 1, 32, 64, torch.float16, ragged=True)
    out = rk.run(q, k, v, lens, softmax_scale=0.3)
    ref = reference(q, k, v, lens, scale=0.3)
    assert (out.float() - ref).abs().max().item() <= 2e-2
    out2 = rk.run(q, k, v, lens, softmax_scale=0.3)
    assert out2.data_ptr() != out.data_ptr()


def test_prepare_then_run(rk):
    q, k, v, lens, bt = make_inputs(5, 300, 4, 1, 64, torch.float16, page=32, ragged=True)
    assert rk.prepare(q, k, v, lens, block_table=bt) is None  # MHA, head_dim 64, page 32
    check(rk, 5, 300, 4, 1, D=64, dtype=torch.float16, page=32, ragged=True)


def test_bad_head_ratio_raises(rk):
    q = torch.randn(2, 1, 6, 64, dtype=torch.float16)
    k = torch.randn(2, 10, 4, 64, dtype=torch.float16)
    lens = torch.full((2,), 10, dtype=torch.int32)
    with pytest.raises(ValueError):
        rk.run(q, k, k.clone(), lens)
    with pytest.raises(ValueError):
        rk.prepare(q, k, k.clone(), lens)


def test_contract_surface(rk):
    assert rk.BACKEND == "tilelang"
    case = {"batch": 1, "seqlen_k": 61519, "kv_heads": 4, "gqa": 8, "head_dim": 128, "dtype": "float16",
            "page_size": None}
    cfgs = rk.configs(case)
    assert isinstance(cfgs, list) and cfgs and all(isinstance(c, dict) for c in cfgs)
    assert cfgs[0]["num_splits"] == 0  # heuristic default first


def test_configs_offer_even_ranges_that_apply(rk, meta_plan):
    """configs()' even-range entries resolve to plans that are not eager and split evenly (the only plans even_split
    changes), and only where ceil ranges would differ: case 14's 481 128-key tiles in 64 splits, not 8192 keys."""
    case = {"batch": 1, "seqlen_k": 61519, "kv_heads": 4, "gqa": 8}
    even = [c for c in rk.configs(case) if c.get("even_split")]
    assert {(c["block_N"], c["num_splits"]) for c in even} == {(bn, ns) for bn in (64, 128) for ns in (16, 32, 64, 128)}
    for c in even:
        p = meta_plan(1, 61519, 4, 8, c)
        assert (p.even_split, p.eager, p.num_splits, p.block_N) == (True, False, c["num_splits"], c["block_N"])
    plain = meta_plan(1, 61519, 4, 8, {"block_N": 128, "num_splits": 64})
    assert plain.eager and not plain.even_split  # 8 tiles a split: eager by default, where even ranges do not apply
    assert not [c for c in rk.configs({"batch": 1, "seqlen_k": 8192, "kv_heads": 4, "gqa": 8}) if c.get("even_split")]


needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None and not pathlib.Path("/usr/local/cuda/bin/nvcc").exists(),
                                reason="nvcc not installed")


@pytest.fixture
def meta_plan(rk):
    """plan(batch, seqlen, kv_heads, gqa, config): rk._cuda_plan on meta tensors (contiguous, fp16, head dim 128)
    for the H200's profile (132 units, warps of 32, 228 KB a unit, PDL): the CUDA plan without a GPU."""
    from kopt.hardware import profile

    h200 = rk._dev.from_profile(profile("H200").model_dump())

    def plan(batch, seqlen, kv_heads, gqa, config=None):
        q = torch.zeros(batch, 1, kv_heads * gqa, 128, dtype=torch.float16, device="meta")
        k = torch.zeros(batch, seqlen, kv_heads, 128, dtype=torch.float16, device="meta")
        return rk._cuda_plan(q, k, None, None, config, device=h200)

    return plan


def _kernel_bodies(src: str) -> dict:
    """Kernel name -> its source text, up to the next kernel."""
    parts = re.split(r'(?=extern "C" __global__)', src)
    out = {}
    for p in parts:
        m = re.search(r'__global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)\(', p)
        if m:
            out[m.group(1)] = p
    return out


@needs_nvcc
@pytest.mark.parametrize(
    "shape",
    [
        dict(dtype="float16", hq=32, hkv=8, d=128, paged=False, split=True),
        dict(dtype="bfloat16", hq=32, hkv=4, d=128, paged=True, page_size=16, split=True),
    ],
    ids=["fp16-contig-split", "bf16-paged16-split"],
)
def test_cuda_sm90a_lowers_and_compiles(rk, shape):
    src = rk.build_cuda_source(**shape)  # main + combine kernels, CUDA C++ for sm_90a
    assert "__global__" in src and "combine_kernel" in src
    info = rk.compile_cuda_check(**shape)
    assert set(info) == {"main"}
    # one prim_func, two device kernels: the split kernel and the combine kernel behind it,
    # launched by the same host call
    assert sorted(_kernel_bodies(info["main"]["source"])) == ["decode_split_combine_kernel",
                                                              "decode_split_combine_kernel_1"]
    for name in info:
        assert info[name]["cubin_bytes"] > 0
        assert all(s == 0 for s in info[name]["spill_bytes"]), info[name]["ptxas_log"][-2000:]
    assert 0 < info["main"]["dyn_smem_bytes"] <= 227 * 1024
    assert "mma" in info["main"]["source"]  # QK^T and PV on the tensor cores


@needs_nvcc
@pytest.mark.parametrize("paged", [0, 64], ids=["contig", "paged64"])
@pytest.mark.parametrize("split", [True, False], ids=["split", "direct"])
def test_eager_variant_issues_q_and_k_before_l(rk, split, paged):
    """The eager variant's first cp.async group (Q and the first K tile) is addressed from the allocated
    cache length alone, so it is issued before the sequence length read from L[b] is used; V still waits
    for it (rows past the sequence would feed NaN garbage to the PV product). The default variant loads
    Q synchronously first. Both nvcc-compile for sm_90a without spills."""
    shape = dict(dtype="float16", hq=32, hkv=4, d=128, paged=bool(paged), page_size=paged or 256, split=split)
    eager = rk.compile_cuda_check(eager=True, **shape)["main"]
    assert all(s == 0 for s in eager["spill_bytes"]), eager["ptxas_log"][-2000:]
    body = eager["source"].split("__launch_bounds__", 1)[1]
    first_commit = body.index("cp_async_commit")
    group0 = body[:first_commit]
    copies = group0.split("cp_async_gs")[1:]
    dests = {name for c in copies for name in ("Q_shared", "K_shared", "V_shared") if c.split(",")[0].count(name)}
    assert dests == {"Q_shared", "K_shared"}
    assert all("seqlen)" not in c and "seqlen -" not in c for c in copies)  # no L[b] in the addresses
    assert "if (0 <" not in group0.split("cp_async_gs")[0]  # no guard on the tile count before the first copy
    if paged:  # page ids read from the block table are clamped into the pool (entries past the sequence)
        assert "max(min(BT[" in group0 and "num_blocks" in group0
    plain = rk.build_cuda_source(**shape).split("__launch_bounds__", 1)[1]
    assert plain.index("__syncthreads") < plain.index("cp_async_gs")  # the default: Q first, then a barrier
    if paged:  # without eager every row is clamped to the sequence: its page id needs no clamp
        assert "BT[" in plain and "max(min(BT[" not in plain


@needs_nvcc
@pytest.mark.parametrize("block_N,smem_kb", [(32, (16, 32)), (160, (80, 100)), (192, (96, 128)), (256, (128, 227))])
def test_wide_tiles_hold_a_short_range_in_one_tile(rk, block_N, smem_kb):
    """block_N 32, 160 and 192 (the defaults for unsplit ranges of at most 32 and of 129-192 keys) and 256 (a config
    knob): a CTA whose range fits one tile issues all its K and V loads before the first wait (one K group, one V
    group, then the loop's first wait), with no spills, in 22 / 90 / 106 / 141 KB of shared memory."""
    info = rk.compile_cuda_check(dtype="float16", hq=32, hkv=4, d=128, paged=False, split=False, block_N=block_N,
                                 eager=True)["main"]
    assert all(s == 0 for s in info["spill_bytes"]), info["ptxas_log"][-2000:]
    body = info["source"].split("__launch_bounds__", 1)[1]
    assert body.index("V_shared") < body.index("cp_async_wait")  # V's copies issued before any wait
    assert smem_kb[0] * 1024 < info["dyn_smem_bytes"] <= smem_kb[1] * 1024


@needs_nvcc
@pytest.mark.parametrize("d", [128, 64])
def test_v_split_reads_half_of_v_per_cta(rk, d):
    """v_split 2: the grid's x dimension picks a CTA's half of V's and the output's columns (V rows read from
    column blockIdx.x * d / 2, the V tile and the PV accumulator halved), K still whole; no spills; a split plan
    refuses it."""
    import sys

    shape = dict(dtype="float16", hq=32, hkv=4, d=d, paged=False, split=False, block_N=160, eager=True)
    one = rk.compile_cuda_check(v_split=1, **shape)["main"]
    two = rk.compile_cuda_check(v_split=2, **shape)["main"]
    assert all(s == 0 for s in two["spill_bytes"]), two["ptxas_log"][-2000:]
    assert one["dyn_smem_bytes"] - two["dyn_smem_bytes"] == 160 * d // 2 * 2  # half of the V tile
    body = two["source"].split("__launch_bounds__", 1)[1]
    assert f"((int64_t)((int)blockIdx.x)) * (int64_t){d // 2}" in body
    assert "blockIdx.x" not in one["source"].split("__launch_bounds__", 1)[1]
    cu = sys.modules["tl_decode_cuda"]
    with pytest.raises(ValueError, match="v_split"):
        cu.kernel_plan(hq=32, hkv=4, d=d, split=True, v_split=2)


@needs_nvcc
@pytest.mark.parametrize("threads", [128, 64])
def test_red_batch_reduces_both_rows_of_a_thread_at_once(rk, threads, meta_plan):
    """red_batch 2 (the default): the softmax's row max and row sum are one batched butterfly each (both of a
    thread's rows through one set of barriers), red_batch 1 one butterfly per row; both compile without spills, and
    a value other than 1 or 2 is refused by the kernel builder and by the plan."""
    import sys

    shape = dict(dtype="float16", hq=32, hkv=4, d=128, paged=False, split=False, block_N=64, eager=True,
                 threads=threads)
    two = rk.compile_cuda_check(**shape)["main"]
    one = rk.compile_cuda_check(red_batch=1, **shape)["main"]
    for info in (one, two):
        assert all(s == 0 for s in info["spill_bytes"]), info["ptxas_log"][-2000:]
    # batch 2 over a workspace of one slot a thread: max and sum, cross-warp and in-quad, in the loop and its tail
    assert two["source"].count(f"NamedBarrier<{threads}>, 2, {threads}>::run_batch(") >= 4
    assert "::run_batch(" not in one["source"] and one["source"].count("::run(") >= 4
    cu = sys.modules["tl_decode_cuda"]
    with pytest.raises(ValueError, match="red_batch"):
        cu.kernel_plan(hq=32, hkv=4, split=False, red_batch=4)
    with pytest.raises(ValueError, match="red_batch"):
        meta_plan(1, 64, 4, 8, {"red_batch": 3})


def _ptx_barriers(source: str) -> int:
    """bar.sync / barrier.sync instructions in the PTX of a kernel source (nvcc, sm_90a, no GPU)."""
    from tilelang.contrib import nvcc as tl_nvcc

    ptx = tl_nvcc.compile_cuda(source, "ptx", ["-gencode", "arch=compute_90a,code=sm_90a"],
                               options=tl_nvcc.default_compile_options(["-std=c++20", "-w"]))
    text = bytes(ptx).decode()
    return text.count("bar.sync") + text.count("barrier.sync")


@needs_nvcc
def test_red_once_crosses_four_warps_in_one_round(rk):
    """red_once: the kernel's source carries the one-round specialization of tl::AllReduce for four warps (once,
    on the first kernel of a module), the softmax's reductions hit it (AllReduce<..., 128, 32, ...>), it compiles
    without spills and its PTX has fewer barriers than TileLang's two-round butterfly; a split plan with its
    combine kernel in the same module compiles too (one definition)."""
    shape = dict(dtype="float16", hq=32, hkv=4, d=128, paged=False, split=False, block_N=160, eager=True,
                 threads=128, v_split=2)
    once = rk.compile_cuda_check(red_once=True, **shape)["main"]
    plain = rk.compile_cuda_check(**shape)["main"]
    spec = "struct AllReduce<Reducer, 128, 32, thread_offset"
    assert once["source"].count(spec) == 1 and spec not in plain["source"]
    for info in (once, plain):
        assert "tl::AllReduce<tl::MaxOp, 128, 32, 0," in info["source"]
        assert all(s == 0 for s in info["spill_bytes"]), info["ptxas_log"][-2000:]
    # two reductions (max, sum) in the loop and in its peeled last tile: two barriers fewer each
    assert _ptx_barriers(once["source"]) <= _ptx_barriers(plain["source"]) - 8
    fused = rk.compile_cuda_check(red_once=True, **{**shape, "split": True, "v_split": 1, "block_N": 128,
                                                    "eager": False})["main"]
    assert fused["source"].count(spec) == 1 and fused["cubin_bytes"] > 0


def test_red_once_in_the_plan(meta_plan):
    """The plan takes red_once from red_once_default (no config key): on for case 5 (unsplit, eager), off for
    case 10 (eager splits), untuned (64-key tiles) and at its tuned H200 row (128-key tiles; both of a thread's rows
    through one reduction, as every eager plan)."""
    assert meta_plan(16, 141, 4, 8).red_once is True  # case 5: unsplit, eager
    p10 = meta_plan(1, 8192, 4, 8)  # case 10 untuned (this host): eager splits of 64-key tiles
    assert p10.num_splits > 1 and p10.eager and p10.red_once is False and p10.red_batch == 2
    p10 = meta_plan(1, 8192, 4, 8, {"block_N": 128, "num_splits": 32})  # its tuned H200 row
    assert p10.eager and p10.red_once is False and p10.red_batch == 2


def test_fast_math_in_the_plan_and_the_pass_configs(meta_plan):
    """fast_math: the plan takes it from fast_math_default (on wherever nvcc builds: no config key); it reaches
    TileLang as its fast-math pass config (nvcc --use_fast_math), and only then."""
    import sys

    from tilelang.transform import PassConfigKey

    cu = sys.modules["tl_decode_cuda"]
    assert meta_plan(16, 141, 4, 8).fast_math is cu.fast_math_default() is True
    assert cu.fast_math_default(nvcc=False) is False
    assert cu._pass_configs(True).get(PassConfigKey.TL_ENABLE_FAST_MATH) is True
    assert PassConfigKey.TL_ENABLE_FAST_MATH not in cu._pass_configs(False)
    assert cu._pass_configs(False)[PassConfigKey.TL_DISABLE_SAFE_MEMORY_ACCESS] is True


@pytest.mark.parametrize("split,eager,want", [(False, True, True), (False, False, True), (True, False, True),
                                              (True, True, False)])
def test_red_once_default(rk, split, eager, want):
    """One-round cross-warp reductions by default, except on eager split plans (case 10, where they measured 4-5%
    slower)."""
    import sys

    assert sys.modules["tl_decode_cuda"].red_once_default(split, eager) is want


@pytest.mark.parametrize("block_N,eager,want", [(160, True, 2), (128, True, 2), (64, False, 2), (32, True, 2),
                                              (128, False, 1), (256, False, 1)])
def test_red_batch_default(rk, block_N, eager, want):
    """Batched reductions by default on eager (short) plans, split or not (case 10: its split CTAs stream two 128-key
    tiles), and narrow tiles; long streams of 128-key tiles keep one row at a time."""
    import sys

    assert sys.modules["tl_decode_cuda"].red_batch_default(block_N, eager) == want


def test_configs_default_entry_leaves_threads_to_the_plan(rk):
    """The tuner's first config is the heuristic plan itself: it pins no thread count (two warps where the plan
    picks them), so a tuned 'default' row is the plan the kernel would run untuned."""
    cfgs = rk.configs({"batch": 1, "seqlen_k": 1, "kv_heads": 4, "gqa": 8})
    assert cfgs[0] == {"block_N": 0, "num_splits": 0, "threads": 0}


@pytest.mark.parametrize("shape,want", [
    ((16, 4, 1), 2),    # case 5: 64 rows, two CTAs a row fit one a unit
    ((1, 4, 1), 2),     # case 1
    ((66, 1, 1), 2),    # 132 CTAs: exactly one a unit
    ((67, 1, 1), 1),
    ((16, 8, 1), 1),    # case 6: 128 rows
    ((64, 8, 1), 1),    # case 4
    ((1, 4, 32), 1),    # case 10: a split plan
])
def test_v_split_default(rk, shape, want):
    """v_split 2 by default only for an unsplit plan whose CTAs, two a row, fit one a unit (132 here)."""
    import sys

    B, hkv, ns = shape
    assert sys.modules["tl_decode_cuda"].v_split_default(B, hkv, ns, 132) == want


@pytest.mark.parametrize("paged,page,block_N,eager,want", [
    (True, 16, 64, False, True),     # a tile of four pages
    (True, 256, 64, False, True),    # a page of four tiles
    (True, 64, 64, False, True),
    (True, 16, 160, False, True),    # ten pages a tile
    (True, 64, 160, False, False),   # a tile ends inside a page and the next starts there
    (True, 256, 192, False, False),
    (True, 16, 64, True, False),     # eager rows may pass the sequence: their own clamped page
    (False, 256, 64, False, False),
])
def test_tile_page_applies(rk, paged, page, block_N, eager, want):
    """tile_page (a row's page from its tile's first page) only on paged, non-eager plans whose pages hold whole
    tiles or tiles whole pages: elsewhere a tile's first page plus the row's page within the tile is not the row's."""
    import sys

    assert sys.modules["tl_decode_cuda"].tile_page_applies(paged, page, block_N, eager) == want


@pytest.mark.parametrize("block_N,v_split,want", [(32, 2, 64), (32, 1, 128), (64, 2, 128), (160, 2, 128),
                                                  (128, 1, 128)])
def test_default_threads(rk, block_N, v_split, want):
    """Two warps by default only for a tile of at most 32 keys on a few-row grid (v_split 2), four otherwise."""
    import sys

    assert sys.modules["tl_decode_cuda"].default_threads(block_N, v_split) == want


@needs_nvcc
def test_two_warp_narrow_tile_compiles_without_spills(rk):
    """Case 3's default plan (one 32-key tile, v_split 2, 64 threads) lowers for sm_90a with a 64-thread launch
    bound and no spills."""
    info = rk.compile_cuda_check(dtype="bfloat16", hq=32, hkv=4, d=128, paged=True, page_size=16, split=False,
                                 block_N=32, eager=True, v_split=2, threads=64)["main"]
    assert all(s == 0 for s in info["spill_bytes"]), info["ptxas_log"][-2000:]
    assert "__launch_bounds__(64" in info["source"]


@needs_nvcc
def test_pdl_switch_launches_the_combine_as_a_dependent(rk):
    """pdl (Hopper): the split kernel allows its dependent's launch at its start and the combine kernel waits
    for the split grid before it reads a partial; the balanced combine derives its plan from L first. The
    portable variant (pdl off) has neither instruction. The fused pdl variant nvcc-compiles without spills."""
    shape = dict(dtype="float16", hq=32, hkv=4, d=128, paged=False, split=True, block_N=128, eager=True)
    info = rk.compile_cuda_check(pdl=True, **shape)["main"]
    assert all(s == 0 for s in info["spill_bytes"]), info["ptxas_log"][-2000:]
    k = _kernel_bodies(info["source"])
    split, comb = k["decode_split_combine_kernel"], k["decode_split_combine_kernel_1"]
    assert "cudaTriggerProgrammaticLaunchCompletion" in split and "cudaGridDependencySynchronize" not in split
    assert split.index("cudaTriggerProgrammaticLaunchCompletion") < split.index("cp_async_gs")
    assert comb.index("cudaGridDependencySynchronize") < comb.index("Opart[")
    plain = rk.build_cuda_source(pdl=False, **shape)
    assert "cudaGridDependencySynchronize" not in plain and "cudaTriggerProgrammaticLaunchCompletion" not in plain
    bal = _kernel_bodies(rk.build_cuda_source(dtype="float16", hq=32, hkv=4, d=128, split=True, balanced=132,
                                              block_N=128, last_cta=False, pdl=True))
    bcomb = bal["decode_balanced_kernel_1"]
    assert bcomb.index("L[") < bcomb.index("cudaGridDependencySynchronize") < bcomb.index("Opart[")


@needs_nvcc
def test_last_cta_variant_is_one_kernel_with_an_acq_rel_counter(rk):
    """The last-CTA merge: one device kernel (no combine launch); partial writes fenced before thread 0's
    acq_rel atomic on the (batch, kv head) counter; the merging CTA resets the counter. No spills."""
    info = rk.compile_cuda_check(dtype="float16", hq=32, hkv=4, d=128, paged=False, split=True, last_cta=True)
    assert set(info) == {"main"}
    src = info["main"]["source"]
    assert sorted(_kernel_bodies(src)) == ["decode_split_last_kernel"]
    fence, atomic = src.index("__threadfence()"), src.index("AtomicAddRet(")
    assert fence < atomic and ", 1, 4)" in src[atomic:atomic + 200]  # memory order 4: acq_rel
    assert re.search(r"Cnt\[[^\]]*\] = 0;", src)
    assert all(s == 0 for s in info["main"]["spill_bytes"]), info["main"]["ptxas_log"][-2000:]


@pytest.mark.parametrize("num_splits,unroll", [(1, 0), (5, 0), (16, 0), (33, 0), (40, 0), (67, 0), (17, 16), (40, 8)])
def test_combine_merge_arithmetic(rk, num_splits, unroll):
    """The split-KV combine (chunked loads, running max; the default chunk and smaller ones, split counts
    that do not fill the last chunk) run as a C-target kernel: equals the softmax-weighted sum of the
    partials, and empty splits (LSE -inf) weigh nothing."""
    import sys

    import tilelang

    cu = sys.modules["tl_decode_cuda"]  # imported by run_kernel.py from its own folder
    kern = tilelang.compile(cu.build_combine_serial(4, 8, unroll), target="c")
    g = torch.Generator().manual_seed(num_splits)
    opart = torch.randn(2, 4, num_splits, 8, generator=g)
    lse = torch.randn(2, 4, num_splits, generator=g) * 3
    lse[0, 1, :] = -math.inf  # a row whose splits are all empty: output 0
    opart[0, 1, :] = 0
    if num_splits > 2:
        lse[1, 2, 1] = -math.inf
        opart[1, 2, 1] = 0
    out = torch.full((2, 4, 8), float("nan"))
    kern(opart, lse, out)
    w = torch.softmax(lse * math.log(2.0), dim=-1).nan_to_num(0.0)
    ref = (w[..., None] * opart).sum(2)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert out[0, 1].abs().max() == 0


@pytest.mark.parametrize("case,want", [
    ((64, 8, 2048), (64, 1)),    # case 7: 512 CTAs, several per SM -> the 64-key tile's occupancy
    ((32, 8, 4096), (64, 1)),    # case 9: 256 CTAs
    ((16, 8, 362), (128, 1)),    # case 6: 128 CTAs, at most one per SM, a range past 256 keys
    ((64, 8, 64), (64, 1)),      # case 4: a short range
    ((16, 4, 141), (160, 1)),    # case 5: 64 CTAs, at most one per SM, one tile of its 141 keys rounded up to 32
    ((16, 4, 129), (160, 1)),
    ((16, 4, 161), (192, 1)),
    ((16, 4, 192), (192, 1)),    # the widest range one such tile holds
    ((16, 4, 128), (64, 1)),     # a range two 64-key tiles hold
    ((16, 4, 17), (32, 1)),      # case 3: one 32-key tile, not 64 keys of which 47 re-read the last
    ((1, 4, 1), (32, 1)),        # case 1
    ((256, 8, 20), (32, 1)),     # at most 32 keys: one 32-key tile whatever the grid
    ((16, 4, 33), (64, 1)),
    ((64, 8, 141), (64, 1)),     # 512 CTAs: several per SM, the 64-key tile's occupancy
    ((1, 4, 8192), (64, 32)),    # case 10: split
    ((1, 4, 61519), (64, 65)),   # case 14: split, about 2 CTAs per SM (the tuning table pins 128 x 32)
])
def test_default_tiling(rk, case, want):
    """The default tile: when one CTA per (batch, kv head) streams the whole range and those CTAs fit one per
    unit (132 SMs), 128 keys for a range past 256 keys and one tile of the range rounded up to 32 keys for
    129-192 keys; one 32-key tile for a range of at most 32 keys; otherwise 64 keys. Explicit values win."""
    import sys

    cu = sys.modules["tl_decode_cuda"]
    B, hkv, s = case
    assert cu.choose_tiling(B, hkv, s, 132) == want
    assert cu.choose_tiling(B, hkv, s, 132, block_N=128, num_splits=1) == (128, 1)


@needs_nvcc
@pytest.mark.parametrize("paged", [0, 16], ids=["contig", "paged16"])
def test_balanced_variant_plans_on_the_device(rk, paged):
    """The work-balanced variant: one kernel (in-kernel merge), a grid of B + pool rows per kv head, the
    split plan computed from L on the device (a loop over the batch's lengths), no spills."""
    info = rk.compile_cuda_check(dtype="bfloat16" if paged else "float16", hq=32, hkv=4, d=128, paged=bool(paged),
                                 page_size=paged or 256, split=True, balanced=264)
    assert set(info) == {"main"}
    src = info["main"]["source"]
    assert sorted(_kernel_bodies(src)) == ["decode_balanced_kernel"]
    assert "for (int i = 0; i < batch; ++i)" in src and "AtomicAddRet(" in src
    assert all(s == 0 for s in info["main"]["spill_bytes"]), info["main"]["ptxas_log"][-2000:]


@pytest.mark.parametrize("case,want", [
    ((16, 8, 32768, 4), (64, 34, 264)),   # R1: one 32768 row among fifteen of 512
    ((8, 4, 131072, 8), (128, 34, 132)),  # R3 (G 8: 128-key tiles, one CTA per unit)
    ((4, 4, 61519, 16), (128, 34, 132)),  # R4: one 61519 row and three of 17
    ((64, 8, 2048, 1), None),             # case 7: a short allocated length keeps the plain kernel
    ((16, 4, 4096, 4), None),             # case 8: likewise
    ((1, 8, 58966, 33), None),            # case 13: one row; the plain kernel cuts its own length
    ((1, 4, 61519, 65), None),            # a pinned split count (tuned row) keeps the plain kernel
])
def test_balanced_plan_from_shapes(rk, case, want):
    """The balanced launch depends on shapes and the allocated length only (CUDA-graph safe)."""
    B, hkv, s, uniform = case
    cfg = {"num_splits": uniform} if want is None and uniform == 65 else {}
    gqa = 32 // hkv  # the cases' query heads: 32
    assert rk._balanced_splits(cfg, B, hkv, s, 132, 0, uniform, gqa) == want


def test_balanced_tiling_given_wins_over_the_gqa_rule(rk):
    """R4's shape (G 8, contiguous): 128-key tiles at one CTA per unit by default; a given tile and CTAs per unit
    win; G 4 and pages of 32 tokens or more keep 64-key tiles at two per unit; 16-token pages take 128-key tiles at
    two per unit."""
    assert rk._balanced_splits({}, 4, 4, 61519, 132, 0, 16, 8) == (128, 34, 132)
    assert rk._balanced_splits({"bal_per_sm": 2}, 4, 4, 61519, 132, 64, 16, 8) == (64, 67, 264)
    assert rk._balanced_splits({}, 4, 4, 61519, 132, 0, 16, 4) == (64, 67, 264)  # G 4: the 64-key plan
    assert rk._balanced_splits({}, 4, 4, 61519, 132, 0, 16, 8, page_size=256) == (64, 67, 264)  # paged: likewise
    assert rk._balanced_splits({}, 4, 4, 61519, 132, 0, 16, 8, page_size=32) == (64, 67, 264)
    assert rk._balanced_splits({}, 4, 4, 61519, 132, 0, 16, 8, page_size=16) == (128, 67, 264)
    assert rk._balanced_splits({}, 16, 8, 32768, 132, 0, 4, 4, page_size=16) == (128, 34, 264)  # R1
    assert rk._balanced_splits({}, 4, 4, 61519, 132, 64, 16, 8, page_size=16) == (64, 67, 264)  # a given tile wins


@needs_nvcc
@pytest.mark.parametrize("page", [16, 256])
def test_tile_page_takes_a_rows_page_from_its_tile(rk, page):
    """tile_page: the table column of a row is its tile's first page plus the row's page within the tile, so once
    lowered no table load depends on the thread (rows of one page share a load; the default's every row has its
    own), and the kernel compiles without spills for pages of several tiles and tiles of several pages."""
    shape = dict(dtype="float16", hq=32, hkv=8, d=128, paged=True, page_size=page, block_N=64, balanced=264)
    tp = rk.compile_cuda_check(tile_page=True, **shape)["main"]
    plain = rk.compile_cuda_check(**shape)["main"]

    def per_thread(src):
        return [x for x in re.findall(r"BT\[[^\]]*\]", src) if "threadIdx" in x]

    assert per_thread(plain["source"]) and not per_thread(tp["source"])
    assert all(s == 0 for s in tp["spill_bytes"]), tp["ptxas_log"][-2000:]


@pytest.mark.parametrize("balanced,page,want", [(264, 16, True), (264, 8, True), (264, 32, False), (264, 256, False),
                                                (132, 0, False), (0, 16, False)])
def test_even_split_default(rk, balanced, page, want):
    """Even split ranges by default only on balanced plans in pages of at most BAL_WIDE_MAX_PAGE tokens: elsewhere
    (contiguous R4, 256-token pages, plain split plans) the screen found them slower."""
    import sys

    assert sys.modules["tl_decode_cuda"].even_split_default(balanced, page) == want


@pytest.mark.parametrize("num_splits,smem,want", [(67, True, 64), (48, True, 64), (47, True, 0), (34, True, 0),
                                                  (32, True, 0), (4, True, 0), (67, False, 0)])
def test_comb_unroll_default(rk, num_splits, smem, want):
    """A combine thread loads 64 splits a round trip by default only where the plan's rows may hold at least 48 splits
    (not contiguous R4's 34, of which it uses 32) and the LSE values go through shared memory (without it, 64 cost 231
    registers)."""
    import sys

    assert sys.modules["tl_decode_cuda"].comb_unroll_default(num_splits, smem) == want


@needs_nvcc
def test_combine_lse_in_shared_memory_fits_beside_two_split_ctas(rk):
    """comb_smem: 64 splits a round trip compile for sm_90a without spills in fewer registers than a combine CTA
    may take beside two balanced split CTAs (163 registers each, 128 threads: 22,528 of 65,536 left, so at most
    176 a thread); the LSE values are stored once and read behind a barrier."""
    import sys

    info = sys.modules["tl_decode_cuda"].compile_combine_check(unroll=64)
    assert all(s == 0 for s in info["spill_bytes"]), info["ptxas_log"][-2000:]
    assert max(info["registers"]) <= 176, info["registers"]
    assert "__syncthreads()" in info["source"] and "LSE[" in info["source"]


def test_device_facts_from_profiles(rk):
    """tl_device.from_profile: the H200 is a CUDA sm_90a device with dependent launch; the C500 a MACA one at wave64
    with 64 KB a unit and none of it; a profile without its unit count, warp size or shared memory (the host's)
    plans nothing."""
    from kopt.hardware import profile

    h200 = rk._dev.from_profile(profile("H200").model_dump())
    assert (h200.backend, h200.arch, h200.units, h200.warp_size, h200.dependent_launch, h200.nvcc) == \
        ("cuda", "sm_90a", 132, 32, True, True)
    a100 = rk._dev.from_profile(profile("A100").model_dump())
    assert (a100.arch, a100.dependent_launch) == ("sm_80", False)
    c500 = rk._dev.from_profile(profile("C500").model_dump())
    assert (c500.backend, c500.units, c500.warp_size, c500.smem_per_unit, c500.dependent_launch, c500.nvcc) == \
        ("maca", 104, 64, 65536, False, False)
    with pytest.raises(ValueError, match="cannot plan the kernel: no warp_size"):
        rk._dev.from_profile({**profile("C500").model_dump(), "warp_size": None})
    with pytest.raises(ValueError, match="cannot plan the kernel: no units"):
        rk._dev.from_profile(profile("cpu").model_dump())


@pytest.mark.parametrize("G,d,threads,want", [(4, 128, 128, 4), (8, 128, 128, 8), (1, 64, 128, 1), (2, 64, 128, 2),
                                              (7, 64, 128, 8), (3, 64, 128, 4), (3, 128, 256, 4), (5, 64, 256, 8),
                                              (7, 128, 128, 7)])
def test_merge_rows(rk, G, d, threads, want):
    """The last-CTA merge pads its rows only where G x d values do not spread evenly over the threads (GQA 7 at head dim
    64: 'no available layout found' before); every H200 bench plan (G 4 or 8 at head dim 128) keeps G."""
    import sys

    assert sys.modules["tl_decode_cuda"].merge_rows(G, d, threads) == want


@needs_nvcc
def test_odd_gqa_at_head_dim_64_merges_in_the_last_cta(rk):
    """GQA 7 at head dim 64 (Hq 14, Hkv 2), split with the last-CTA merge: lowered and nvcc-compiled for sm_90a without
    spills (before merge_rows its merge found no fragment layout and the kernel did not compile)."""
    info = rk.compile_cuda_check(dtype="float16", hq=14, hkv=2, d=64, split=True, last_cta=True)
    assert info["main"]["cubin_bytes"] > 0 and all(s == 0 for s in info["main"]["spill_bytes"])
    assert "decode_split_last_kernel" in info["main"]["source"]
