"""kopt candidate: GQA decode attention with a KV cache, written in TileLang.

Contract (loaded by path by the kopt harness):
    BACKEND = "tilelang"
    run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None, config=None) -> Tensor
    configs(case) -> list[dict]      (first entry = heuristic default)
    prepare(...) -> None             (compiles ahead; same arguments as run)

CUDA tensors run the split-KV TileLang CUDA kernels of tl_decode_cuda.py (plus a combine kernel
when the KV range is split); CPU tensors run the TileLang C-target kernel of tl_decode_cpu.py.
Only torch is imported at module level; tilelang is imported on first compile.
"""
import math
import os
import sys

import torch

BACKEND = "tilelang"

_HERE = os.path.dirname(os.path.abspath(__file__))


# sibling modules (the harness loads this file by path, so make its folder importable)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import tl_decode_cpu as _cpu  # noqa: E402
import tl_decode_cuda as _cuda  # noqa: E402
import tl_device as _dev  # noqa: E402  (the device facts a plan reads: the torch device's, or a profile's)
import tuning_lookup as _tuning  # noqa: E402  (tuned configs per shape and device, results/tilelang/tuning.csv)

# config keys understood by the CUDA path
_CFG_KEYS = ("block_N", "num_splits", "num_stages", "threads", "fused", "eager", "last_cta", "balanced",
             "bal_per_sm", "q_loop", "merge_unroll", "bal_combine", "pdl", "comb_unroll", "v_split", "red_batch",
             "red_once", "fast_math", "tile_page", "even_split", "comb_smem")


#: configs() offers even split ranges (not eager) for split counts from this one on
EVEN_MIN_SPLITS = 16


# ----------------------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------------------
def _check(q, k_cache, v_cache, cache_seqlens, block_table):
    if q.dim() != 4 or q.shape[1] != 1:
        raise ValueError(f"q must be [B, 1, Hq, D] (one decode token), got {tuple(q.shape)}")
    if k_cache.dim() != 4 or v_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache/v_cache must be equal 4-d shapes, got {tuple(k_cache.shape)} / {tuple(v_cache.shape)}")
    B, _, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    if k_cache.shape[3] != D:
        raise ValueError(f"head_dim mismatch: q has {D}, cache has {k_cache.shape[3]}")
    if Hkv <= 0 or Hq % Hkv != 0:
        raise ValueError(f"num query heads ({Hq}) must be a multiple of num kv heads ({Hkv})")
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(f"dtype mismatch: q {q.dtype}, k {k_cache.dtype}, v {v_cache.dtype}")
    if cache_seqlens.dim() != 1 or cache_seqlens.shape[0] != B:
        raise ValueError(f"cache_seqlens must be [B]={B}, got {tuple(cache_seqlens.shape)}")
    if block_table is not None:
        if block_table.dim() != 2 or block_table.shape[0] != B:
            raise ValueError(f"block_table must be [B, max_pages], got {tuple(block_table.shape)}")
    elif k_cache.shape[0] != B:
        raise ValueError(f"contiguous k_cache batch {k_cache.shape[0]} != q batch {B}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("cache_seqlens", cache_seqlens)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q is on {q.device}")
    if block_table is not None and block_table.device != q.device:
        raise ValueError(f"block_table is on {block_table.device}, q is on {q.device}")


def _check_config(config):
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise ValueError(f"config must be a dict or None, got {type(config).__name__}")
    return config


# ----------------------------------------------------------------------------------------------
# CUDA path
# ----------------------------------------------------------------------------------------------
class _Plan:
    __slots__ = ("dtype", "hq", "hkv", "d", "paged", "page", "block_N", "num_stages", "threads", "num_splits",
                 "fused", "eager", "last_cta", "balanced", "q_loop", "merge_unroll", "bal_combine", "pdl", "comb_unroll",
                 "v_split", "red_batch", "red_once", "fast_math", "tile_page", "even_split", "comb_smem", "scale",
                 "target", "device",
                 "main", "comb", "dummy_bt", "opart", "lse", "cnt")


_PLANS: dict = {}


def _cuda_plan(q, k_cache, block_table, softmax_scale, config, device=None) -> "_Plan":
    """Resolve config + heuristics into a plan (uncached; see _get_plan). ``device`` (a tl_device.Device): the device
    whose facts the plan reads, by default q's (tl_device.from_torch); another one's plan has no compile target."""
    dev = device if device is not None else _dev.from_torch(q.device)
    if q.dtype not in _cuda._DTYPES:
        raise ValueError(f"CUDA path supports float16/bfloat16, got {q.dtype}")
    B, _, Hq, D = q.shape
    if D not in (64, 128):
        raise ValueError(f"CUDA path supports head_dim 64 or 128, got {D}")
    Hkv = k_cache.shape[2]
    paged = block_table is not None
    page = int(k_cache.shape[1]) if paged else 0
    if paged and page < 1:
        raise ValueError("page_size must be >= 1")
    # An explicit config wins; else the tuned row for this shape and device; else the heuristic below.
    cfg = _check_config(config) or _tuning.lookup_for(q, k_cache, block_table, keys=_CFG_KEYS,
                                                      device=(dev.name, dev.units)) or {}
    unknown = set(cfg) - set(_CFG_KEYS) - {"cpu_block_N"}
    if unknown:
        raise ValueError(f"unknown config keys {sorted(unknown)} (known: {list(_CFG_KEYS)})")
    base = _cuda.default_config(Hq // Hkv, D, page if paged else None)
    p = _Plan()
    p.dtype = _cuda._DTYPES[q.dtype]
    p.hq, p.hkv, p.d, p.paged, p.page = Hq, Hkv, D, paged, page
    p.num_stages = int(cfg.get("num_stages", base["num_stages"]))
    p.threads = int(cfg.get("threads") or base["threads"])
    p.fused = bool(int(cfg.get("fused", base["fused"])))
    bn = int(cfg.get("block_N") or 0)
    if bn % 32 or not 0 <= bn <= 256 or p.threads not in (64, 128, 256) or p.num_stages not in (0, 1):
        raise ValueError(f"unsupported CUDA config block_N={bn} threads={p.threads} num_stages={p.num_stages} "
                         "(block_N a multiple of 32 up to 256, threads 64/128/256, num_stages 0/1)")
    # longest possible sequence (cache_seqlens stays on the device: no host sync to read it)
    max_seqlen = int(block_table.shape[1]) * page if paged else int(k_cache.shape[1])
    G = Hq // Hkv
    p.block_N, p.num_splits = _cuda.choose_tiling(B, Hkv, max(1, max_seqlen), dev.units, bn,
                                                  int(cfg.get("num_splits") or 0),
                                                  _cuda.widest_tile(G, D, dev.smem_per_unit, False, p.threads))
    last_cta = cfg.get("last_cta", base["last_cta"])
    if last_cta is None:  # default: in-kernel merge of small merges only (tl_decode_cuda.LAST_CTA_MAX_ROWS)
        last_cta = (Hq // Hkv) * p.num_splits <= _cuda.LAST_CTA_MAX_ROWS
    # the last-CTA merge holds at most _MAX_SPLITS weights per head
    p.last_cta = bool(int(last_cta)) and p.num_splits <= _cuda._MAX_SPLITS
    eager = cfg.get("eager", base["eager"])
    if eager is None:  # default: eager when each CTA streams few tiles (see tl_decode_cuda.EAGER_MAX_TILES)
        tiles_per_cta = -(-(-(-max(1, max_seqlen) // p.block_N)) // p.num_splits)
        eager = tiles_per_cta <= _cuda.EAGER_MAX_TILES
    p.eager = bool(int(eager))
    p.balanced, p.q_loop, p.merge_unroll, p.bal_combine = 0, False, 0, False
    bal = _balanced_splits(cfg, B, Hkv, max(1, max_seqlen), dev.units, bn, p.num_splits, G, page,
                           _cuda.widest_tile(G, D, dev.smem_per_unit, True, p.threads))
    if bal is not None:
        p.block_N, p.num_splits, p.balanced = bal
        p.last_cta, p.eager = True, False
        p.q_loop = bool(int(cfg.get("q_loop", _cuda.BAL_Q_LOOP)))
        p.merge_unroll = int(cfg.get("merge_unroll") or _cuda.BAL_MERGE_UNROLL)
        bc = cfg.get("bal_combine")  # default: a combine kernel when a full row's merge is large
        p.bal_combine = bool(int(bc)) if bc is not None else (Hq // Hkv) * p.num_splits > _cuda.LAST_CTA_MAX_ROWS
    combine_kernel = _cuda.combine_follows(p.num_splits > 1, p.last_cta, p.balanced, p.bal_combine)
    # programmatic dependent launch of the combine kernel (default where the device has it: CUDA, Hopper and later)
    pdl = cfg.get("pdl")
    p.pdl = (bool(int(pdl)) if pdl is not None else dev.dependent_launch) and combine_kernel
    if p.pdl and not dev.dependent_launch:
        raise ValueError(f"config pdl=1 on {dev.name}: no programmatic dependent launch there (CUDA, Hopper and later)")
    vs = cfg.get("v_split")  # a row's V columns over this many CTAs (tl_decode_cuda.build_decode), unsplit plans only
    p.v_split = int(vs) if vs is not None else _cuda.v_split_default(B, Hkv, p.num_splits, dev.units)
    if p.v_split not in (1, 2) or (p.v_split > 1 and (p.num_splits > 1 or p.balanced)):
        raise ValueError(f"unsupported CUDA config v_split={p.v_split} with num_splits={p.num_splits} "
                         "(1, or 2 on an unsplit plan)")
    rb = cfg.get("red_batch")  # a thread's rows per softmax reduction (tl_decode_cuda.red_batch_default)
    split_plan = p.num_splits > 1 and not p.balanced
    p.red_batch = int(rb) if rb is not None else _cuda.red_batch_default(p.block_N, p.eager, dev.warp_size)
    if p.red_batch not in (1, 2) or p.red_batch > _cuda.tile_rows_per_thread(dev.warp_size):
        raise ValueError(f"unsupported CUDA config red_batch={p.red_batch} on {dev.name} (1 or 2, at most the "
                         f"{_cuda.tile_rows_per_thread(dev.warp_size)} rows a thread holds at a warp of {dev.warp_size})")
    ro = cfg.get("red_once")  # cross-warp reductions in one shared-memory round (tl_decode_cuda.red_once_default)
    p.red_once = bool(int(ro)) if ro is not None else _cuda.red_once_default(split_plan, p.eager, dev.nvcc,
                                                                            dev.warp_size)
    if p.red_once and not (dev.nvcc and dev.warp_size == 32):
        raise ValueError(f"config red_once=1 on {dev.name}: it specializes TileLang's CUDA template for warps of 32")
    fm = cfg.get("fast_math")  # nvcc --use_fast_math for this plan's kernels (tl_decode_cuda.fast_math_default)
    p.fast_math = bool(int(fm)) if fm is not None else _cuda.fast_math_default(dev.nvcc)
    # a row's page from its tile's first page (tl_decode_cuda.build_decode's tile_page; default on): paged, not eager
    tp = cfg.get("tile_page")
    p.tile_page = (bool(int(tp)) if tp is not None else True) and _cuda.tile_page_applies(paged, page, p.block_N,
                                                                                           p.eager)
    # split ranges that differ by at most one tile (tl_decode_cuda.build_decode's even_split): not eager
    es = cfg.get("even_split")
    p.even_split = (bool(int(es)) if es is not None else _cuda.even_split_default(p.balanced, page)) and not p.eager
    # the combine's LSE values through shared memory (build_decode's comb_smem): plans with a combine kernel
    cs = cfg.get("comb_smem")
    p.comb_smem = (bool(int(cs)) if cs is not None else bool(_cuda.COMB_SMEM)) and combine_kernel
    # splits a combine thread loads at once (0: tl_decode_cuda._COMBINE_UNROLL; tl_decode_cuda.comb_unroll_default)
    p.comb_unroll = int(cfg.get("comb_unroll") or _cuda.comb_unroll_default(p.num_splits, p.comb_smem))
    if not cfg.get("threads"):  # default: two warps for the narrowest tiles of few-row grids (tl_decode_cuda)
        p.threads = _cuda.default_threads(p.block_N, p.v_split, dev.warp_size)
    merge = bool(p.balanced) or (p.last_cta and p.num_splits > 1)
    need = _cuda.smem_bytes(G, D, p.block_N, p.v_split, merge, p.threads)
    if dev.smem_per_unit and need > dev.smem_per_unit:
        raise ValueError(f"block_N={p.block_N} needs about {need} bytes of shared memory a CTA at head dim {D}; "
                         f"{dev.name} has {dev.smem_per_unit} a unit")
    p.scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(D)
    p.device = dev
    p.target = _cuda.cuda_target(q.device) if device is None else None
    p.main = p.comb = p.dummy_bt = p.opart = p.lse = p.cnt = None
    return p


def _balanced_splits(cfg, batch, hkv, max_seqlen, num_sms, block_N, uniform_splits, gqa=1, page_size=0,
                     max_tile=_cuda.MAX_TILE):
    """(block_N, max splits per row, target CTAs) of the work-balanced kernel, or None for the plain one.

    The balanced kernel splits each row by its own length, read on the device (tl_decode_cuda: the batch's
    real tiles over about ``bal_per_sm`` CTAs per unit), so its launch depends on shapes only. Default:
    balanced when no split count is pinned (explicitly or by a tuned row), the allocated length has at least
    BAL_MIN_ALLOC_TILES 64-key tiles, the batch has several rows (one row is balanced by the plain kernel: it
    cuts its own length into the splits), and one full-length row could use more splits than the uniform
    plan's. Tiles and CTAs per unit (unless given): 64-key tiles at BAL_CTAS_PER_SM CTAs per unit, or, for a
    contiguous cache with BAL_WIDE_GQA query heads per KV head or more, 128-key tiles at one CTA per unit
    (choose_tiling's rule for CTAs that fit the units; paged caches lost with it), or, in pages of at most
    BAL_WIDE_MAX_PAGE tokens, 128-key tiles at BAL_CTAS_PER_SM. page_size: 0 for a contiguous cache. max_tile
    (tl_decode_cuda.widest_tile): where 128-key tiles do not fit a unit's shared memory, 64-key tiles at
    BAL_CTAS_PER_SM."""
    bal = cfg.get("balanced")
    if bal is not None and not int(bal):
        return None
    wide = gqa >= _cuda.BAL_WIDE_GQA and not page_size and 128 <= max_tile
    bn = block_N or (128 if 128 <= max_tile and (wide or 0 < page_size <= _cuda.BAL_WIDE_MAX_PAGE) else 64)
    alloc_tiles = -(-max_seqlen // bn)
    per_sm = cfg.get("bal_per_sm") or (1 if wide else _cuda.BAL_CTAS_PER_SM)
    target = max(1, round(float(per_sm) * num_sms))
    mt = _cuda.BAL_MIN_TILES
    ns = min(_cuda._MAX_SPLITS, -(-target // hkv) + 1, max(1, (2 * alloc_tiles + mt) // (2 * mt)))
    if bal is None and (batch < 2 or int(cfg.get("num_splits") or 0) > 0
                        or -(-max_seqlen // 64) < _cuda.BAL_MIN_ALLOC_TILES or ns <= uniform_splits):
        return None
    return bn, max(ns, 2), target


def _plan_key(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, config):
    cfg = None
    if config:
        cfg = tuple(sorted(config.items())) if isinstance(config, dict) else config
    bt = None if block_table is None else (block_table.shape, block_table.dtype, block_table.device)
    return (q.shape, q.dtype, q.device, q.stride(), k_cache.shape, k_cache.dtype, k_cache.device, v_cache.shape,
            v_cache.dtype, v_cache.device, cache_seqlens.shape, cache_seqlens.device, bt, softmax_scale, cfg)


def _get_plan(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, config) -> "_Plan":
    """Cached plan per shape/dtype/device/config: validation, heuristics, kernels and the split
    workspaces are resolved once, so a call costs a dict lookup plus the kernel launches."""
    key = _plan_key(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, config)
    p = _PLANS.get(key)
    if p is None:
        _check(q, k_cache, v_cache, cache_seqlens, block_table)
        p = _cuda_plan(q, k_cache, block_table, softmax_scale, config)
        main, comb = _cuda_kernels(p)
        p.main = _cuda.fast_call(main)
        p.comb = _cuda.fast_call(comb) if comb is not None else None
        B = q.shape[0]
        if not p.paged:
            # placeholder block table: the contiguous kernel never reads it
            p.dummy_bt = torch.zeros((B, 1), dtype=torch.int32, device=q.device)
        if p.num_splits > 1:
            # split workspaces, reused by every call of this plan (calls are ordered on the stream)
            p.opart = torch.empty((B, p.hq, p.num_splits, p.d), dtype=torch.float32, device=q.device)
            p.lse = torch.empty((B, p.hq, p.num_splits), dtype=torch.float32, device=q.device)
            if p.last_cta:
                # arrival counters of the last-CTA merge; each call leaves them at 0 again
                p.cnt = torch.zeros((B, p.hkv), dtype=torch.int32, device=q.device)
        if len(_PLANS) > 1024:
            _PLANS.clear()
        _PLANS[key] = p
    return p


def _cuda_kernels(p: "_Plan"):
    split = p.num_splits > 1
    main = _cuda.get_decode(p.dtype, p.hq, p.hkv, p.d, p.paged, p.page, p.block_N, p.num_stages, p.threads, split,
                            p.scale, p.target, p.fused, p.eager, p.last_cta, p.balanced, p.q_loop,
                            p.merge_unroll, p.bal_combine, p.pdl, p.comb_unroll, p.v_split, p.red_batch,
                            p.red_once, p.fast_math, p.tile_page, p.even_split, p.comb_smem)
    # fused: the combine kernel is launched by the same host call as the split kernel; last_cta: no
    # combine kernel (the last CTA of each (batch, kv head) merges)
    comb = None
    if split and not (p.fused or p.last_cta):
        comb = _cuda.get_combine(p.dtype, p.hq, p.d, p.target, p.pdl, p.comb_unroll, p.fast_math, p.comb_smem)
    return main, comb


def _run_cuda(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, config):
    p = _get_plan(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, config)
    B = q.shape[0]
    dev = q.device
    q3 = q.view(B, p.hq, p.d) if q.is_contiguous() else q.reshape(B, p.hq, p.d).contiguous()
    k = k_cache if k_cache.is_contiguous() else k_cache.contiguous()
    v = v_cache if v_cache.is_contiguous() else v_cache.contiguous()
    lens = cache_seqlens
    if lens.dtype != torch.int32 or not lens.is_contiguous():
        lens = lens.to(torch.int32).contiguous()
    if p.paged:
        bt = block_table
        if bt.dtype != torch.int32 or not bt.is_contiguous():
            bt = bt.to(torch.int32).contiguous()
    else:
        bt = p.dummy_bt
    switch = dev.index is not None and dev.index != torch.cuda.current_device()
    if switch:
        prev = torch.cuda.current_device()
        torch.cuda.set_device(dev)
    try:
        out = torch.empty((B, p.hq, p.d), dtype=q.dtype, device=dev)
        if p.num_splits == 1:
            p.main(q3, k, v, lens, bt, out)
        elif p.last_cta:
            p.main(q3, k, v, lens, bt, p.opart, p.lse, p.cnt, out)
        elif p.comb is None:
            p.main(q3, k, v, lens, bt, p.opart, p.lse, out)  # split + combine, one host call
        else:
            p.main(q3, k, v, lens, bt, p.opart, p.lse)
            p.comb(p.opart, p.lse, out)
    finally:
        if switch:
            torch.cuda.set_device(prev)
    return out.view(B, 1, p.hq, p.d)


def plan_info(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None, config=None) -> dict:
    """The resolved plan of a call (block_N, num_splits, ...; CPU: the C-target path), for reports."""
    if not q.is_cuda:
        return {"path": "c-target"}
    return _plan_fields(_get_plan(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, config))


_TORCH_DTYPES = {"fp16": torch.float16, "float16": torch.float16, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}


def _meta_call(case: dict):
    """(q, k_cache, block_table) of a case (the shape dict configs() takes) as meta tensors: shapes, no data."""
    dt = _TORCH_DTYPES.get(str(case.get("dtype") or "fp16").removeprefix("torch."))
    if dt is None:
        raise ValueError(f"unsupported dtype {case.get('dtype')!r} (fp16 or bf16)")
    B, S, hkv = int(case["batch"]), int(case["seqlen_k"]), int(case["kv_heads"])
    d, page = int(case.get("head_dim") or 128), int(case.get("page_size") or 0)
    q = torch.empty((B, 1, hkv * int(case["gqa"]), d), dtype=dt, device="meta")
    if not page:
        return q, torch.empty((B, S, hkv, d), dtype=dt, device="meta"), None
    pages = -(-S // page)
    return q, torch.empty((B * pages, page, hkv, d), dtype=dt, device="meta"), \
        torch.empty((B, pages), dtype=torch.int32, device="meta")


def device_plan(case: dict, device: dict, config=None) -> dict:
    """The plan this kernel resolves for a case on a device given by its profile (a dict: name, vendor, arch, units,
    warp_size, smem_per_unit_bytes, l2_bytes), on any machine: what it would run there. plan_info's fields, the
    kernels it launches, its shared memory a CTA (tl_decode_cuda.smem_bytes) and the device facts it read."""
    dev = _dev.from_profile(device)
    q, k, bt = _meta_call(case)
    _check(q, k, k, torch.empty((q.shape[0],), dtype=torch.int32, device="meta"), bt)
    p = _cuda_plan(q, k, bt, None, config, device=dev)
    split = p.num_splits > 1
    main = ("decode_balanced" if p.balanced else "decode_split_last" if split and p.last_cta
            else "decode_split_combine" if split and p.fused else "decode_split" if split else "decode_direct")
    merge = bool(p.balanced) or (split and p.last_cta)
    return {**_plan_fields(p), "kernels": [main] + (["combine"] if main == "decode_split" else []),
            "smem_bytes": _cuda.smem_bytes(p.hq // p.hkv, p.d, p.block_N, p.v_split, merge, p.threads),
            "device": dev.name, "backend": dev.backend, "arch": dev.arch, "units": dev.units,
            "warp_size": dev.warp_size, "smem_per_unit": dev.smem_per_unit, "l2_bytes": dev.l2_bytes}


def lower_plan(case: dict, device: dict, target, config=None) -> dict:
    """device_plan's kernels lowered for a TileLang target (e.g. {"kind": "hip", "mcpu": "gfx942"}, a wave64 target
    this TileLang has, for a device whose own backend it lacks), without a device: {"plan": device_plan's dict,
    "kernels": {"main": {"source", "dyn_smem_bytes"}, "combine": ...}}."""
    plan = device_plan(case, device, config)
    shape = {k: plan[k] for k in ("block_N", "num_stages", "threads", "fused", "eager", "balanced", "q_loop",
                                  "merge_unroll", "bal_combine", "pdl", "comb_unroll", "v_split", "red_batch",
                                  "red_once", "tile_page", "even_split", "comb_smem")}
    q, k, _ = _meta_call(case)
    shape.update(dtype=_cuda._DTYPES[q.dtype], hq=q.shape[2], hkv=k.shape[2], d=q.shape[3], paged=plan["paged"],
                 page_size=plan["page_size"], split=plan["num_splits"] > 1 or bool(plan["balanced"]),
                 last_cta=plan["last_cta"] or bool(plan["balanced"]))
    return {"plan": plan, "kernels": _cuda.lower_kernels(target, **shape)}


def _plan_fields(p: "_Plan") -> dict:
    return {"path": "cuda", "block_N": p.block_N, "num_splits": p.num_splits, "num_stages": p.num_stages, "threads": p.threads,
            "fused": p.fused, "eager": p.eager, "last_cta": p.last_cta and p.num_splits > 1, "paged": p.paged,
            "balanced": p.balanced, "q_loop": p.q_loop, "merge_unroll": p.merge_unroll,
            "bal_combine": p.bal_combine, "pdl": p.pdl, "comb_unroll": p.comb_unroll,
            "v_split": p.v_split, "red_batch": p.red_batch, "red_once": p.red_once, "fast_math": p.fast_math,
            "tile_page": p.tile_page, "even_split": p.even_split, "comb_smem": p.comb_smem,
            "page_size": p.page}


# ----------------------------------------------------------------------------------------------
# public API
# ----------------------------------------------------------------------------------------------
def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None, config=None) -> torch.Tensor:
    if q.is_cuda:
        return _run_cuda(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, config)  # validates per plan
    _check(q, k_cache, v_cache, cache_seqlens, block_table)
    if q.device.type == "cpu":
        _check_config(config)
        return _cpu.run(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, config)
    raise ValueError(f"unsupported device {q.device}")


def prepare(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None, config=None) -> None:
    if q.is_cuda:
        _get_plan(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, config)
        return
    _check(q, k_cache, v_cache, cache_seqlens, block_table)
    if q.device.type == "cpu":
        _check_config(config)
        _cpu.prepare(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, config)
    else:
        raise ValueError(f"unsupported device {q.device}")


def configs(case: dict) -> list:
    """Tunable CUDA configs for one shape; the first entry is the heuristic default.

    block_N / num_splits 0 mean "chosen at run time" (SM-count split heuristic; 128-key tiles
    without split when the CTAs fit one per unit, else 64-key tiles: tl_decode_cuda.choose_tiling). The other entries
    pin block_N x num_splits; from EVEN_MIN_SPLITS splits on, each also with even split ranges and the eager start off
    (even_split applies to plans that are not eager; 64 even splits of case 14's 481 tiles: 1.017x over its tuned 32).
    """
    seqlen = int(case.get("seqlen_k", 1) or 1)
    out = [{"block_N": 0, "num_splits": 0, "num_stages": 1, "threads": 0}]  # threads 0: the plan's own default
    for bn in (64, 128):
        n_tiles = -(-seqlen // bn)
        for ns in (1, 2, 4, 8, 16, 32, 64, 128):
            if ns <= n_tiles:
                out.append({"block_N": bn, "num_splits": ns, "num_stages": 1, "threads": 128})
                if ns >= EVEN_MIN_SPLITS and n_tiles % ns:  # even ranges differ from ceil ranges only then
                    out.append({"block_N": bn, "num_splits": ns, "num_stages": 1, "threads": 128, "eager": 0,
                                "even_split": 1})
    return out


# ----------------------------------------------------------------------------------------------
# GPU-less checks of the CUDA kernels
# ----------------------------------------------------------------------------------------------
def build_cuda_source(**shape) -> str:
    """CUDA C++ of the main (and, when split, combine) kernels for sm_90a, lowered without a GPU.

    Keys: dtype ("float16"/"bfloat16"), hq, hkv, d, paged (bool), page_size, block_N, num_stages,
    threads, split (bool), scale, arch ("sm_90a").
    """
    return _cuda.build_cuda_source(**shape)


def compile_cuda_check(with_combine: bool = True, **shape) -> dict:
    """Lower and nvcc-compile the main (and combine) kernels for sm_90a without a GPU.

    Same keys as build_cuda_source. Returns per kernel ("main", "combine"): cubin_bytes,
    registers, spill_bytes, dyn_smem_bytes, ptxas_log, source.
    """
    return _cuda.compile_cuda_check(with_combine=with_combine, **shape)
