"""CPU tests of the TileLang decode candidate (solution/tilelang/run_kernel.py).

run() on CPU tensors goes through the TileLang C-target kernel; results are compared with an fp32
reference written here in plain torch. The CUDA kernels are lowered and nvcc-compiled for sm_90a
without a GPU (skipped when nvcc is missing): what they are checked for is behaviour the compiler
reports (they compile, spill nothing, fit their shared memory and registers, and the PTX's barrier
counts), not TileLang's text. A text assertion is kept only where the property IS the generated code
(an instruction, or the order the kernel issues its loads in, that no CPU run can show), and says so.
Each sm_90a build is made once a run, ahead of the tests in a background process where a second core
is free (KERNEL_BUILDS, tests/kernel_builds.py); nvcc runs are cached by source hash for the run as
well (conftest.nvcc_cache).
"""
import importlib.util
import math
import pathlib
import re
import shutil

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUN_KERNEL = ROOT / "solution" / "tilelang" / "run_kernel.py"

pytest.importorskip("tilelang")


@pytest.fixture(scope="module")
def rk(nvcc_cache):
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


def test_nvcc_cache_builds_a_source_once():
    """conftest.NvccCache: a build asked for again (same source, format, arch and flags) does not run nvcc again and
    replays its log (ptxas -v); another flag, format or source is another build; a build into a named file, or one
    that reads the current target, is never cached."""
    import logging

    from conftest import NvccCache

    calls, seen = [], []
    log = logging.getLogger("kopt.tests.nvcc_cache")
    log.setLevel(logging.INFO)
    log.propagate = False

    class Seen(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    def compile_cuda(code, target_format="ptx", arch=None, options=None, path_target=None, verbose=False):
        calls.append((code, target_format, options))
        if verbose:
            log.info("ptxas of %s", code)
        return bytearray(f"{target_format}:{code}".encode())

    cache = NvccCache(compile_cuda, log, "nvcc")
    log.addHandler(Seen())
    arch = ["-gencode", "arch=compute_90a,code=sm_90a"]
    a = cache("k1", "cubin", arch, ["-O3"], verbose=True)
    b = cache("k1", "cubin", arch, ["-O3"], verbose=True)
    assert a == b == bytearray(b"cubin:k1") and len(calls) == 1 and seen == ["ptxas of k1"] * 2
    cache("k1", "cubin", arch, ["-O2"])
    cache("k1", "ptx", arch, ["-O3"])
    cache("k2", "cubin", arch, ["-O3"])
    assert len(calls) == 4 and (cache.hits, cache.misses) == (1, 4)
    cache("k1", "cubin", arch, ["-O3"], path_target="out.cubin")
    cache("k1", "cubin", None, ["-O3"])
    cache("k1", "cubin", None, ["-O3"])
    assert len(calls) == 7 and cache.hits == 1


def test_builds_are_made_once_read_back_and_taken_over(tmp_path):
    """kernel_builds.Builds: a build is made once and stored; another process's Builds reads it back; one claimed by a
    background process that has stopped is made here; without a folder it is made in process."""
    import subprocess
    import sys

    from kernel_builds import Builds, key

    class Kernel:
        calls: list = []

        def compile_cuda_check(self, **kw):
            self.calls.append(kw)
            return {"main": {"kw": kw}}

    rk = Kernel()
    first = Builds(rk, tmp_path)
    assert first.get("compile", d=64) == {"main": {"kw": {"d": 64}}} == first.get("compile", d=64)
    assert Builds(rk, tmp_path).get("compile", d=64) == {"main": {"kw": {"d": 64}}} and len(rk.calls) == 1
    (tmp_path / f"{key('compile', {'d': 128})}.claim").touch()            # claimed by a process that is gone
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert Builds(rk, tmp_path, gone).get("compile", d=128)["main"]["kw"] == {"d": 128} and len(rk.calls) == 2
    assert (tmp_path / f"{key('compile', {'d': 128})}.pkl").exists()
    assert Builds(rk, None).get("compile", d=32) and len(rk.calls) == 3


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


def _defs(src: str) -> list[str]:
    """The device kernels a CUDA source defines, in order: each one's text up to the next (forward declarations
    left out)."""
    parts = re.split(r'(?=extern "C" __global__)', src)[1:]
    return [p for p in parts if "{" in p.split(";", 1)[0]]


def _clean(info: dict) -> None:
    """An nvcc build that produced a cubin and spilled no register."""
    assert info["cubin_bytes"] > 0
    assert all(s == 0 for s in info["spill_bytes"]), info["ptxas_log"][-2000:]


def _cu():
    import sys

    return sys.modules["tl_decode_cuda"]  # imported by run_kernel.py from its own folder


# ---------------------------------------------------------------- the sm_90a builds (tests/kernel_builds.py)

F16 = dict(dtype="float16", hq=32, hkv=4, d=128)
SM90A = [dict(dtype="float16", hq=32, hkv=8, d=128, paged=False, split=True),
         dict(dtype="bfloat16", hq=32, hkv=4, d=128, paged=True, page_size=16, split=True)]


def eager_shape(split: bool, paged: int) -> dict:
    return dict(**F16, paged=bool(paged), page_size=paged or 256, split=split)


def wide_shape(block_N: int) -> dict:
    return dict(**F16, paged=False, split=False, block_N=block_N, eager=True)


def v_split_shape(d: int) -> dict:
    return dict(dtype="float16", hq=32, hkv=4, d=d, paged=False, split=False, block_N=160, eager=True)


def red_batch_shape(threads: int) -> dict:
    return dict(**F16, paged=False, split=False, block_N=64, eager=True, threads=threads)


RED_ONCE = dict(**F16, paged=False, split=False, block_N=160, eager=True, threads=128, v_split=2)
RED_ONCE_SPLIT = {**RED_ONCE, "split": True, "v_split": 1, "block_N": 128, "eager": False}
TWO_WARP = dict(dtype="bfloat16", hq=32, hkv=4, d=128, paged=True, page_size=16, split=False, block_N=32, eager=True,
                v_split=2, threads=64)
PDL = dict(**F16, paged=False, split=True, block_N=128, eager=True)
PDL_BALANCED = dict(**F16, split=True, balanced=132, block_N=128, last_cta=False, pdl=True)
LAST_CTA = dict(**F16, paged=False, split=True, last_cta=True)
ODD_GQA = dict(dtype="float16", hq=14, hkv=2, d=64, split=True, last_cta=True)
COMBINE_SMEM = dict(unroll=64)


def balanced_shape(paged: int) -> dict:
    return dict(dtype="bfloat16" if paged else "float16", hq=32, hkv=4, d=128, paged=bool(paged),
                page_size=paged or 256, split=True, balanced=264)


def tile_page_shape(page: int) -> dict:
    return dict(dtype="float16", hq=32, hkv=8, d=128, paged=True, page_size=page, block_N=64, balanced=264)


#: Every build the tests below ask `builds` for, in the order they ask: made ahead in a background process
#: (tests/kernel_builds.py). A build missing here is still made, in the test's own process.
KERNEL_BUILDS = (
    [("compile", s) for s in SM90A]
    + [b for split in (True, False) for paged in (0, 64)
       for b in (("compile", {"eager": True, **eager_shape(split, paged)}), ("source", eager_shape(split, paged)))]
    + [("compile", wide_shape(n)) for n in (32, 96, 160, 192, 256)]
    + [b for d in (128, 64) for b in (("lowered", {"v_split": 1, **v_split_shape(d)}),
                                      ("compile", {"v_split": 2, **v_split_shape(d)}))]
    + [(kind, {**one, **red_batch_shape(t)}) for t in (128, 64) for kind in ("compile", "barriers")
       for one in ({}, {"red_batch": 1})]
    + [("compile", {"red_once": True, **RED_ONCE}), ("compile", RED_ONCE), ("barriers", {"red_once": True, **RED_ONCE}),
       ("barriers", RED_ONCE), ("compile", {"red_once": True, **RED_ONCE_SPLIT})]
    + [("compile", TWO_WARP), ("compile", {"pdl": True, **PDL}), ("source", {"pdl": False, **PDL}),
       ("source", PDL_BALANCED), ("compile", LAST_CTA)]
    + [("compile", balanced_shape(p)) for p in (0, 16)]
    + [b for p in (16, 256) for b in (("compile", {"tile_page": True, **tile_page_shape(p)}),
                                      ("lowered", tile_page_shape(p)))]
    + [("combine", COMBINE_SMEM), ("compile", ODD_GQA)]
)


@pytest.fixture(scope="module")
def builds(rk):
    """The builds of KERNEL_BUILDS: builds.get(kind, **keywords), each made once a run (tests/kernel_builds.py)."""
    from conftest import BACKGROUND
    from kernel_builds import Builds

    return Builds(rk, BACKGROUND.get("folder"), BACKGROUND.get("process"))


@needs_nvcc
@pytest.mark.parametrize(
    "shape",
    SM90A,
    ids=["fp16-contig-split", "bf16-paged16-split"],
)
def test_cuda_sm90a_lowers_and_compiles(builds, shape):
    info = builds.get("compile", **shape)
    assert set(info) == {"main"}
    for name in info:
        _clean(info[name])
    # one prim_func, two device kernels (the split kernel and the combine kernel behind it, one host call)
    assert len(_defs(info["main"]["source"])) == 2
    assert 0 < info["main"]["dyn_smem_bytes"] <= 227 * 1024
    # the text is the point: QK^T and PV on the tensor cores (mma), which no CPU run can show
    assert "mma" in info["main"]["source"]


@needs_nvcc
@pytest.mark.parametrize("paged", [0, 64], ids=["contig", "paged64"])
@pytest.mark.parametrize("split", [True, False], ids=["split", "direct"])
def test_eager_variant_issues_q_and_k_before_l(builds, split, paged):
    """The eager variant's first cp.async group (Q and the first K tile) is addressed from the allocated
    cache length alone, so it is issued before the sequence length read from L[b] is used; V still waits
    for it (rows past the sequence would feed NaN garbage to the PV product). The default variant loads
    Q synchronously first. Both nvcc-compile for sm_90a without spills."""
    shape = eager_shape(split, paged)
    eager = builds.get("compile", eager=True, **shape)["main"]
    _clean(eager)
    # the text is the point: the eager start is an order of issue (which copies go before the length is known), seen
    # only in the generated code without a GPU (the GPU tests check its results)
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
    plain = builds.get("source", **shape).split("__launch_bounds__", 1)[1]
    assert plain.index("__syncthreads") < plain.index("cp_async_gs")  # the default: Q first, then a barrier
    if paged:  # without eager every row is clamped to the sequence: its page id needs no clamp
        assert "BT[" in plain and "max(min(BT[" not in plain


@needs_nvcc
@pytest.mark.parametrize("block_N,smem_kb", [(32, (16, 32)), (96, (48, 72)), (160, (80, 100)), (192, (96, 128)),
                                            (256, (128, 227))])
def test_wide_tiles_hold_a_short_range_in_one_tile(builds, block_N, smem_kb):
    """block_N 32, 96, 160 and 192 (the defaults for unsplit ranges of at most 32, of 65-96 and of 129-192 keys) and
    256 (a config knob): a CTA whose range fits one tile issues all its K and V loads before the first wait (one K
    group, one V group, then the loop's first wait), with no spills, in 22 / 57 / 90 / 106 / 141 KB of shared
    memory."""
    info = builds.get("compile", **wide_shape(block_N))["main"]
    _clean(info)
    body = info["source"].split("__launch_bounds__", 1)[1]
    # the text is the point: an order of issue (V's copies before any wait), seen only in the generated code
    assert body.index("V_shared") < body.index("cp_async_wait")
    assert smem_kb[0] * 1024 < info["dyn_smem_bytes"] <= smem_kb[1] * 1024


@needs_nvcc
@pytest.mark.parametrize("d", [128, 64])
def test_v_split_reads_half_of_v_per_cta(builds, d):
    """v_split 2: the grid's x dimension picks a CTA's half of V's and the output's columns (the V tile and the PV
    accumulator halved), K still whole; it compiles without spills; a split plan refuses it."""
    shape = v_split_shape(d)
    one = builds.get("lowered", v_split=1, **shape)
    two = builds.get("compile", v_split=2, **shape)["main"]
    _clean(two)
    assert one["dyn_smem_bytes"] - two["dyn_smem_bytes"] == 160 * d // 2 * 2  # half of the V tile
    # the text is the point: which CTA takes which half is its x block index, read only where V is split
    assert "blockIdx.x" in _defs(two["source"])[0] and "blockIdx.x" not in _defs(one["source"])[0]
    with pytest.raises(ValueError, match="v_split"):
        _cu().kernel_plan(hq=32, hkv=4, d=d, split=True, v_split=2)


@needs_nvcc
@pytest.mark.parametrize("threads", [128, 64])
def test_red_batch_reduces_both_rows_of_a_thread_at_once(builds, threads, meta_plan):
    """red_batch 2 (the default): the softmax's row max and row sum are one batched butterfly each (both of a
    thread's rows through one set of barriers): its PTX holds far fewer barriers than red_batch 1's, one butterfly per
    row; both compile without spills, and a value other than 1 or 2 is refused by the kernel builder and by the
    plan."""
    shape = red_batch_shape(threads)
    two = builds.get("compile", **shape)["main"]
    one = builds.get("compile", red_batch=1, **shape)["main"]
    for info in (one, two):
        _clean(info)
    # max and sum, cross-warp and in-quad, in the loop and its tail: a quarter of the barriers at least go
    assert builds.get("barriers", **shape) <= 0.75 * builds.get("barriers", red_batch=1, **shape)
    with pytest.raises(ValueError, match="red_batch"):
        _cu().kernel_plan(hq=32, hkv=4, split=False, red_batch=4)
    with pytest.raises(ValueError, match="red_batch"):
        meta_plan(1, 64, 4, 8, {"red_batch": 3})


@needs_nvcc
def test_red_once_crosses_four_warps_in_one_round(builds):
    """red_once: the one-round specialization of tl::AllReduce for four warps, which the kernel's source carries,
    takes the softmax's reductions: it compiles without spills and its PTX has fewer barriers than TileLang's
    two-round butterfly; a split plan with its combine kernel in the same module compiles too (one definition of the
    specialization, else nvcc refuses the redefinition)."""
    once = builds.get("compile", red_once=True, **RED_ONCE)["main"]
    plain = builds.get("compile", **RED_ONCE)["main"]
    for info in (once, plain):
        _clean(info)
    # two reductions (max, sum) in the loop and in its peeled last tile: two barriers fewer each
    assert builds.get("barriers", red_once=True, **RED_ONCE) <= builds.get("barriers", **RED_ONCE) - 8
    fused = builds.get("compile", red_once=True, **RED_ONCE_SPLIT)["main"]
    assert fused["cubin_bytes"] > 0 and len(_defs(fused["source"])) == 2


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
def test_two_warp_narrow_tile_compiles_without_spills(builds):
    """Case 3's default plan (one 32-key tile, v_split 2, 64 threads) lowers for sm_90a with a 64-thread launch
    bound and no spills."""
    info = builds.get("compile", **TWO_WARP)["main"]
    _clean(info)
    # the text is the point: the launch bound the kernel is compiled for (ptxas reports no thread count)
    assert "__launch_bounds__(64" in info["source"]


@needs_nvcc
def test_pdl_switch_launches_the_combine_as_a_dependent(builds):
    """pdl (Hopper): the split kernel allows its dependent's launch at its start and the combine kernel waits
    for the split grid before it reads a partial; the balanced combine derives its plan from L first. The
    portable variant (pdl off) has neither instruction. The fused pdl variant nvcc-compiles without spills."""
    info = builds.get("compile", pdl=True, **PDL)["main"]
    _clean(info)
    # the text is the point: dependent launch is two instructions and where they stand, which no CPU run can show
    split, comb = _defs(info["source"])
    assert "cudaTriggerProgrammaticLaunchCompletion" in split and "cudaGridDependencySynchronize" not in split
    assert split.index("cudaTriggerProgrammaticLaunchCompletion") < split.index("cp_async_gs")
    assert comb.index("cudaGridDependencySynchronize") < comb.index("Opart[")
    plain = builds.get("source", pdl=False, **PDL)
    assert "cudaGridDependencySynchronize" not in plain and "cudaTriggerProgrammaticLaunchCompletion" not in plain
    _, bcomb = _defs(builds.get("source", **PDL_BALANCED))
    assert bcomb.index("L[") < bcomb.index("cudaGridDependencySynchronize") < bcomb.index("Opart[")


@needs_nvcc
def test_last_cta_variant_is_one_kernel_with_an_acq_rel_counter(builds):
    """The last-CTA merge: one device kernel (no combine launch); partial writes fenced before thread 0's
    acq_rel atomic on the (batch, kv head) counter; the merging CTA resets the counter. No spills."""
    info = builds.get("compile", **LAST_CTA)
    assert set(info) == {"main"}
    _clean(info["main"])
    src = info["main"]["source"]
    assert len(_defs(src)) == 1
    # the text is the point: a memory order (fence, then an acq_rel atomic), which a CPU run cannot exercise
    fence, atomic = src.index("__threadfence()"), src.index("AtomicAddRet(")
    assert fence < atomic and ", 1, 4)" in src[atomic:atomic + 200]  # memory order 4: acq_rel
    assert re.search(r"Cnt\[[^\]]*\] = 0;", src)


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
    ((16, 4, 128), (128, 1)),    # 64 CTAs, 65-128 keys: one tile (iteration 58), 1 MiB of K past 64 keys a row
    ((16, 4, 96), (96, 1)),
    ((4, 32, 94), (96, 1)),      # 128 CTAs x 32 keys x 256 B past 64 keys: 1 MiB, within ONE_TILE_TRIP_BYTES
    ((32, 4, 110), (64, 1)),     # 128 CTAs x 64 keys x 256 B: 2 MiB for one round trip saved: two 64-key tiles
    ((16, 4, 17), (32, 1)),      # case 3: one 32-key tile, not 64 keys of which 47 re-read the last
    ((1, 4, 1), (32, 1)),        # case 1
    ((256, 8, 20), (32, 1)),     # at most 32 keys: one 32-key tile whatever the grid
    ((16, 4, 33), (64, 1)),
    ((16, 4, 64), (64, 1)),      # one 64-key tile already
    ((64, 8, 141), (64, 1)),     # 512 CTAs: several per SM, the 64-key tile's occupancy
    ((1, 4, 8192), (64, 64)),    # case 10: split, 2 tiles a split (the tuning table pins 128 x 32)
    ((1, 4, 61519), (64, 65)),   # case 14: split, about 2 CTAs per SM (the tuning table pins 128 x 32)
])
def test_default_tiling(rk, case, want):
    """The default tile: when one CTA per (batch, kv head) streams the whole range and those CTAs fit one per
    unit (132 SMs), 128 keys for a range past 256 keys and one tile of the range rounded up to 32 keys for
    65-192 keys (while the K a short row's tile reads past 64 keys stays within ONE_TILE_TRIP_BYTES a round trip
    saved); one 32-key tile for a range of at most 32 keys; otherwise 64 keys. Explicit values win."""
    import sys

    cu = sys.modules["tl_decode_cuda"]
    B, hkv, s = case
    assert cu.choose_tiling(B, hkv, s, 132) == want
    assert cu.choose_tiling(B, hkv, s, 132, block_N=128, num_splits=1) == (128, 1)


def test_one_tile_bound_counts_the_head_dim(rk):
    """The bytes a one-tile grid reads past 64 keys a row are d-wide: 128 CTAs of 110 keys take one 128-key tile at
    head dim 64 (1 MiB) but two 64-key tiles at 128 (2 MiB)."""
    import sys

    cu = sys.modules["tl_decode_cuda"]
    assert cu.choose_tiling(32, 4, 110, 132, d=64) == (128, 1)
    assert cu.choose_tiling(32, 4, 110, 132, d=128) == (64, 1)


@needs_nvcc
@pytest.mark.parametrize("paged", [0, 16], ids=["contig", "paged16"])
def test_balanced_variant_plans_on_the_device(builds, paged):
    """The work-balanced variant: one kernel (in-kernel merge), a grid of B + pool rows per kv head, the
    split plan computed from L on the device (the batch's lengths read a thread a row), no spills."""
    info = builds.get("compile", **balanced_shape(paged))
    assert set(info) == {"main"}
    _clean(info["main"])
    src = info["main"]["source"]
    assert len(_defs(src)) == 1
    # the text is the point: the plan is computed on the device, which no CPU run can show: the batch's tiles summed
    # from a thread a row in passes of the CTA's threads and one reduction; the pool blocks' extra splits a thread a
    # row in shared memory, their prefix sum a warp's scan, and the one row whose pool slots hold the block names
    # itself; an atomic counter for the merge
    assert re.search(r"for \(int \w+ = 0; \w+ < \(\(batch \+ \d+\) >> \d+\);", src)
    assert "tl::AllReduce<tl::SumOp" in src and "tl::CumSum1D<128" in src and "AtomicAddRet(" in src
    assert not re.search(r"for \(int \w+ = 0; \w+ < batch;", src)  # no serial loop over the batch's lengths
    assert not re.search(r"for \(int \w+ = 0; \w+ < min\(128, \(batch", src)  # nor a row at a time in a pass


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


@pytest.mark.parametrize("case,want", [
    ((128, 1, 6804, 2, 8, 16), (128, 14, 264)),  # a fewlong batch of 128 rows in pages of 16: balanced (2.17x, H100)
    ((128, 1, 6804, 2, 8, 0), None),             # the same rows in a contiguous cache (static batches): uniform
    ((2, 8, 8783, 16, 4, 32), None),             # 16 rows the uniform plan already splits 16 ways: uniform
    ((256, 2, 2000, 1, 8, 16), None),            # rows that fill the units alone: uniform
    ((16, 8, 960, 2, 4, 32), None),              # 15 allocated tiles: too short
    ((16, 8, 1024, 2, 4, 32), (64, 4, 264)),     # 16 allocated tiles, pages of 32
])
def test_balanced_small_paged_calls(rk, case, want):
    """Below BAL_MIN_ALLOC_TILES the balanced kernel takes a paged cache (serving engines' ragged batches) from
    BAL_MIN_PAGED_TILES allocated tiles, where the uniform plan splits a row at most BAL_MAX_UNIFORM_SPLITS ways and
    the rows alone do not fill three quarters of the units; a contiguous cache keeps the uniform plan."""
    B, hkv, s, uniform, gqa, page = case
    assert rk._balanced_splits({}, B, hkv, s, 132, 0, uniform, gqa, page) == want


@pytest.mark.parametrize("case,want", [
    ((256, 2, 8192, 1, 8, 32), (64, 32, 264)),   # 512 rows of up to 128 tiles in pages of 32 (20261208/1006): balanced
    ((256, 2, 8192, 1, 8, 0), None),             # the same rows in a contiguous cache: the direct kernel
    ((256, 2, 4032, 1, 8, 32), None),            # 63 allocated tiles: under BAL_LONG_PAGED_TILES
    ((256, 2, 4096, 1, 8, 32), (64, 16, 264)),   # 64 allocated tiles
    ((132, 8, 8192, 1, 4, 256), (64, 32, 264)),  # 1056 rows: BAL_WAVE_ROWS_PER_UNIT (8) rows a unit of 132
    ((133, 8, 8192, 1, 4, 256), None),           # 1064 rows: more waves, which the block scheduler balances itself
])
def test_balanced_paged_rows_that_fill_the_units(rk, case, want):
    """Iteration 57: where a paged batch's rows fill the units, the balanced kernel takes it from BAL_LONG_PAGED_TILES
    allocated tiles up to BAL_WAVE_ROWS_PER_UNIT rows a unit (the direct kernel's time there is its longest row)."""
    B, hkv, s, uniform, gqa, page = case
    assert rk._balanced_splits({}, B, hkv, s, 132, 0, uniform, gqa, page) == want


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
def test_tile_page_takes_a_rows_page_from_its_tile(builds, page):
    """tile_page: the table column of a row is its tile's first page plus the row's page within the tile, so once
    lowered no table load depends on the thread (rows of one page share a load; the default's every row has its
    own), and the kernel compiles without spills for pages of several tiles and tiles of several pages."""
    shape = tile_page_shape(page)
    tp = builds.get("compile", tile_page=True, **shape)["main"]
    plain = builds.get("lowered", **shape)

    def per_thread(src):
        return [x for x in re.findall(r"BT\[[^\]]*\]", src) if "threadIdx" in x]

    # the text is the point: which index a table load takes is an address computation, seen only in the code
    assert per_thread(plain["source"]) and not per_thread(tp["source"])
    _clean(tp)


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
def test_combine_lse_in_shared_memory_fits_beside_two_split_ctas(builds):
    """comb_smem: 64 splits a round trip compile for sm_90a without spills in fewer registers than a combine CTA
    may take beside two balanced split CTAs (163 registers each, 128 threads: 22,528 of 65,536 left, so at most
    176 a thread); the LSE values are stored once and read behind a barrier."""
    info = builds.get("combine", **COMBINE_SMEM)
    _clean(info)
    assert max(info["registers"]) <= 176, info["registers"]
    # the text is the point: the barrier between the shared store and its reads (a race no CPU run can show)
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
def test_odd_gqa_at_head_dim_64_merges_in_the_last_cta(builds):
    """GQA 7 at head dim 64 (Hq 14, Hkv 2), split with the last-CTA merge: lowered and nvcc-compiled for sm_90a without
    spills (before merge_rows its merge found no fragment layout and the kernel did not compile)."""
    info = builds.get("compile", **ODD_GQA)
    _clean(info["main"])
    assert set(info) == {"main"} and len(_defs(info["main"]["source"])) == 1


@pytest.mark.parametrize("paged,eager,ctas,want", [
    (True, True, 265, True),      # past two CTAs a unit of 132: a busy grid streams its bytes
    (True, True, 264, False),     # two a unit: latency-bound, the first tile's address stays free of L[b]
    (True, False, 4096, False),   # not eager: every row is clamped to the sequence already
    (False, True, 4096, False),   # contiguous: the clamp would wait for L[b], a round trip
])
def test_k_clamp_default(rk, paged, eager, ctas, want):
    """k_clamp (an eager paged first K tile's row offsets from L[b]) only on eager paged grids of more than
    BUSY_CTAS_PER_UNIT CTAs a unit."""
    assert _cu().k_clamp_default(paged, eager, ctas, 132) == want


def test_k_clamp_follows_the_grid_and_refuses_plans_it_cannot_run_on(rk):
    """On the H200's profile case 4's shape (64 rows x 8 kv heads, one 64-key tile) clamps in pages (512 CTAs) and not
    at 16 rows (128 CTAs) or in a contiguous cache; a plan asking k_clamp without an eager paged first tile is a
    ValueError naming it."""
    from kopt.hardware import profile

    h200 = profile("H200").model_dump()
    case = dict(batch=64, seqlen_k=64, kv_heads=8, gqa=4, head_dim=128, dtype="fp16")
    assert rk.device_plan({**case, "page_size": 64}, h200)["k_clamp"] is True
    assert rk.device_plan({**case, "page_size": 64, "batch": 16}, h200)["k_clamp"] is False
    assert rk.device_plan({**case, "page_size": 0}, h200)["k_clamp"] is False
    assert rk.device_plan({**case, "page_size": 64}, h200, {"eager": 0})["k_clamp"] is False
    for kw in (dict(paged=True, eager=False), dict(paged=False, eager=True)):
        with pytest.raises(ValueError, match="k_clamp"):
            _cu().kernel_plan(split=False, k_clamp=True, **kw)
