"""kopt candidate: GQA decode attention with a KV cache, written in TileLang.

Contract (loaded by path by the kopt harness):
    BACKEND = "tilelang"
    PLAN_VERSION = <int>             (the plan rule's version: tuned rows carry the one they were measured on)
    run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None, config=None) -> Tensor
    configs(case) -> list[dict]      (first entry = heuristic default)
    prepare(...) -> None             (compiles ahead; same arguments as run)
    plan_info(...) -> dict           (the plan a call runs; same arguments as run)

CUDA tensors run the split-KV TileLang CUDA kernels of tl_decode_cuda.py, built from one frozen plan
(tl_decode_cuda.Plan) that resolve() makes from the shape, the device's facts and a config; CPU tensors run
the TileLang C-target kernel of tl_decode_cpu.py. Only torch is imported at module level; tilelang is
imported on first compile.
"""
import math
import os
import sys
from typing import NamedTuple

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

#: the plan rule's version: a tuned row (results/tilelang/tuning.csv, column plan_version, written by the tuner from
#: this constant) applies only to the version it was measured on; bump it when a config's meaning or a default changes.
#: 2: iterations 57-61 changed the defaults (the balanced kernel in paged caches, one-tile ranges, the floor model's
#: split count, the combine merge on devices with dependent launch) while the table's rows still said 1
PLAN_VERSION = 2

#: config keys of the CUDA path, each one a plan can search (configs()); any other key is a ValueError
_CFG_KEYS = ("block_N", "num_splits", "threads", "eager", "balanced", "bal_per_sm", "last_cta", "v_split", "red_batch",
             "even_split")


#: configs() offers even split ranges (not eager) and the other merge for split counts from this one on
EVEN_MIN_SPLITS = 16


# ----------------------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------------------
def _check(q, k_cache, v_cache, cache_seqlens, block_table):
    if q.dim() != 4 or q.shape[1] != 1:
        raise ValueError(f"q must be [B, 1, Hq, D] (one decode token), got {tuple(q.shape)}")
    if k_cache.dim() != 4 or v_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache/v_cache must be equal 4-d shapes, got {tuple(k_cache.shape)} / "
                         f"{tuple(v_cache.shape)}")
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
# the CUDA plan: one function of the shape, the device's facts and a config (the only place defaults live)
# ----------------------------------------------------------------------------------------------
class _Shape(NamedTuple):
    """What a plan reads of a call: sizes, dtype, layout and the cache's capacity (the longest sequence it holds:
    cache_seqlens stays on the device, so the plan never waits for it)."""

    batch: int
    hq: int
    hkv: int
    d: int
    dtype: str
    paged: bool
    page: int
    capacity: int

    @property
    def G(self) -> int:
        return self.hq // self.hkv


def _shape(q, k_cache, block_table) -> _Shape:
    if q.dtype not in _cuda._DTYPES:
        raise ValueError(f"CUDA path supports float16/bfloat16, got {q.dtype}")
    B, _, Hq, D = q.shape
    if D not in _cuda.HEAD_DIMS:
        raise ValueError(f"head_dim {D} is not supported: the CUDA path takes head dims "
                         f"{', '.join(map(str, _cuda.HEAD_DIMS))}")
    paged = block_table is not None
    page = int(k_cache.shape[1]) if paged else 0
    if paged and page < 1:
        raise ValueError("page_size must be >= 1")
    capacity = int(block_table.shape[1]) * page if paged else int(k_cache.shape[1])
    return _Shape(int(B), int(Hq), int(k_cache.shape[2]), int(D), _cuda._DTYPES[q.dtype], paged, page, capacity)


def _cuda_plan(q, k_cache, block_table, softmax_scale, config, device=None) -> _cuda.Plan:
    """The plan of a call: an explicit config, else the tuned row for this shape and device (_tuned), else the rule
    (resolve). ``device`` (a tl_device.Device): the device whose facts the plan reads, by default q's."""
    dev = device if device is not None else _dev.from_torch(q.device)
    s = _shape(q, k_cache, block_table)
    return resolve(s, dev, _check_config(config) or _tuned(s, dev), softmax_scale)


def _tuned(s: _Shape, dev) -> dict:
    """The tuned config of s's shape bucket on this device, measured on this PLAN_VERSION, from a row whose own shape
    has s's plan class (tuning_lookup); {} when there is none."""
    want = resolve(s, dev, {}).plan_class

    def same_class(batch, capacity):
        row = s._replace(batch=int(batch), capacity=int(capacity or s.capacity))
        return resolve(row, dev, {}).plan_class == want

    return _tuning.lookup(dev.name, dev.units, s.dtype, s.d, s.batch, s.capacity, s.hkv, s.G, s.page,
                          keys=_CFG_KEYS, plan_version=PLAN_VERSION, accept=same_class) or {}


def resolve(s: _Shape, dev, cfg: dict, softmax_scale=None) -> _cuda.Plan:
    """The plan for a shape on a device under a config: the tiling (choose_tiling, or the balanced kernel's), the
    merge, then every switch from its rule in tl_decode_cuda. A key the plan cannot use is a ValueError naming it."""
    unknown = set(cfg) - set(_CFG_KEYS) - {"cpu_block_N"}
    if unknown:
        raise ValueError(f"unknown config keys {sorted(unknown)} (known: {list(_CFG_KEYS)})")
    threads = int(cfg.get("threads") or 0)
    block_N, ns, balanced = _tiling(s, dev, cfg, threads or 128)
    cap, G = max(1, s.capacity), s.G
    eager = cfg.get("eager")
    if eager is None:  # default: eager when each CTA streams few tiles (tl_decode_cuda.EAGER_MAX_TILES)
        tiles = -(-cap // block_N)
        eager = not balanced and -(-tiles // ns) <= _cuda.EAGER_MAX_TILES
    eager = bool(int(eager))
    last_cta = _last_cta(cfg, G, ns, balanced, dev.dependent_launch)
    split = ns > 1 or bool(balanced)
    vs = cfg.get("v_split")  # a row's V columns over this many CTAs, unsplit plans only
    v_split = int(vs) if vs is not None else _cuda.v_split_default(s.batch, s.hkv, ns, dev.units)
    rb = cfg.get("red_batch")
    red_batch = int(rb) if rb is not None else _cuda.red_batch_default(block_N, eager, dev.warp_size)
    if red_batch not in (1, 2) or red_batch > _cuda.tile_rows_per_thread(dev.warp_size):
        held = _cuda.tile_rows_per_thread(dev.warp_size)
        raise ValueError(f"unsupported CUDA config red_batch={red_batch} on {dev.name} (1 or 2, at most the "
                         f"{held} rows a thread holds at a warp of {dev.warp_size})")
    es = cfg.get("even_split")
    even_split = bool(int(es)) if es is not None else _cuda.even_split_default(balanced, s.page)
    combine = split and not last_cta
    p = _cuda.Plan(
        dtype=s.dtype, hq=s.hq, hkv=s.hkv, d=s.d, paged=s.paged, page_size=s.page, block_N=block_N,
        threads=threads or _cuda.default_threads(block_N, v_split, dev.warp_size), num_splits=ns,
        scale=float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(s.d), balanced=balanced,
        last_cta=last_cta, eager=eager, v_split=v_split, red_batch=red_batch,
        red_once=_cuda.red_once_default(ns > 1 and not balanced, eager, dev.nvcc, dev.warp_size),
        tile_page=_cuda.tile_page_applies(s.paged, s.page, block_N, eager), even_split=even_split,
        k_clamp=_cuda.k_clamp_default(s.paged, eager, s.batch * s.hkv * ns * v_split, dev.units),
        pdl=dev.dependent_launch and combine, comb_unroll=_cuda.comb_unroll_default(ns, combine),
        fast_math=_cuda.fast_math_default(dev.nvcc))
    need = _cuda.smem_bytes(G, s.d, p.block_N, p.v_split, p.counter, p.threads)
    if dev.smem_per_unit and need > dev.smem_per_unit:
        raise ValueError(f"block_N={p.block_N} needs about {need} bytes of shared memory a CTA at head dim {s.d}; "
                         f"{dev.name} has {dev.smem_per_unit} a unit")
    return p


def _tiling(s: _Shape, dev, cfg: dict, threads: int) -> tuple:
    """(block_N, num_splits, balanced target CTAs or 0): the uniform tiling (choose_tiling), unless the balanced
    kernel takes the shape (_balanced_splits)."""
    bn = int(cfg.get("block_N") or 0)
    if bn % 32 or not 0 <= bn <= 256 or threads not in (64, 128, 256):
        raise ValueError(f"unsupported CUDA config block_N={bn} threads={threads} "
                         "(block_N a multiple of 32 up to 256, threads 64/128/256)")
    cap, G = max(1, s.capacity), s.G
    block_N, ns = _cuda.choose_tiling(s.batch, s.hkv, cap, dev.units, bn, int(cfg.get("num_splits") or 0),
                                      _cuda.widest_tile(G, s.d, dev.smem_per_unit, False, threads), G, s.d)
    bal = _balanced_splits(cfg, s.batch, s.hkv, cap, dev.units, bn, ns, G, s.page,
                           _cuda.widest_tile(G, s.d, dev.smem_per_unit, True, threads))
    return (block_N, ns, 0) if bal is None else bal


def _last_cta(cfg: dict, G: int, ns: int, balanced: int, dependent_launch: bool) -> bool:
    """Whether split partials merge in a row's last CTA (tl_decode_cuda.last_cta_default), else in a combine kernel
    (balanced: the rows of more than LAST_CTA_MAX_ROWS partial rows)."""
    split = ns > 1 or bool(balanced)
    lc = cfg.get("last_cta")
    if lc is None:
        return split and _cuda.last_cta_default(G, ns, bool(balanced), dependent_launch)
    if not split:
        raise ValueError(f"config last_cta={lc} on an unsplit plan (num_splits 1): there is no merge to place")
    if not int(lc) and balanced and G * ns <= _cuda.LAST_CTA_MAX_ROWS:
        raise ValueError(f"config last_cta=0 on a balanced plan whose rows hold at most {G * ns} partial rows: every "
                         f"row merges in its last CTA (a combine kernel takes rows over {_cuda.LAST_CTA_MAX_ROWS})")
    return bool(int(lc))


def _small_paged_or_long(max_seqlen, page_size, uniform_splits, rows, target, units) -> bool:
    """Whether the balanced kernel may take a shape by its size: from BAL_MIN_ALLOC_TILES 64-key tiles of allocated
    length; or, in a paged cache (how serving engines hold ragged batches; a contiguous one holds static batches of
    near-equal rows), from BAL_MIN_PAGED_TILES, where the uniform plan splits a row at most BAL_MAX_UNIFORM_SPLITS ways
    (many rows: a long one is a long chain there) and the rows do not fill the units alone, or, where they do, from
    BAL_LONG_PAGED_TILES up to BAL_WAVE_ROWS_PER_UNIT rows a unit (the direct kernel's time is then its longest row)."""
    tiles = -(-max_seqlen // 64)
    if tiles >= _cuda.BAL_MIN_ALLOC_TILES:
        return True
    if page_size <= 0 or tiles < _cuda.BAL_MIN_PAGED_TILES or uniform_splits > _cuda.BAL_MAX_UNIFORM_SPLITS:
        return False
    if not _cuda.rows_fill(rows, target):
        return True
    return tiles >= _cuda.BAL_LONG_PAGED_TILES and rows <= _cuda.BAL_WAVE_ROWS_PER_UNIT * units


def _balanced_splits(cfg, batch, hkv, max_seqlen, num_sms, block_N, uniform_splits, gqa=1, page_size=0,
                     max_tile=_cuda.MAX_TILE):
    """(block_N, max splits per row, target CTAs) of the work-balanced kernel, or None for the uniform one.

    The balanced kernel splits each row by its own length, read on the device (tl_decode_cuda: the batch's
    real tiles over about ``bal_per_sm`` CTAs per unit), so its launch depends on shapes only. Default:
    balanced when no key of the uniform kernel is pinned (num_splits, eager 1, v_split 2; explicitly or by a tuned
    row), the allocated length has at least BAL_MIN_ALLOC_TILES 64-key tiles (or, in a paged cache, the smaller size
    of _small_paged_or_long), the batch has several rows (one row is
    balanced by the uniform kernel: it cuts its own length into the splits), and one full-length row could use more
    splits than the uniform plan's. Tiles and CTAs per unit (unless given): 64-key tiles at BAL_CTAS_PER_SM CTAs per
    unit, or, for a contiguous cache with BAL_WIDE_GQA query heads per KV head or more, 128-key tiles at one CTA per
    unit (choose_tiling's rule for CTAs that fit the units; paged caches lost with it), or, in pages of at most
    BAL_WIDE_MAX_PAGE tokens, 128-key tiles at BAL_CTAS_PER_SM. page_size: 0 for a contiguous cache. max_tile
    (tl_decode_cuda.widest_tile): where 128-key tiles do not fit a unit's shared memory, 64-key tiles at
    BAL_CTAS_PER_SM. balanced=1 with num_splits, or bal_per_sm on a plan that is not balanced, is a ValueError."""
    bal = cfg.get("balanced")
    pinned = int(cfg.get("num_splits") or 0) > 0
    if bal is not None and int(bal) and pinned:
        raise ValueError("config balanced=1 with num_splits: a balanced plan splits each row by its own length "
                         "(leave num_splits out)")
    wide = gqa >= _cuda.BAL_WIDE_GQA and not page_size and 128 <= max_tile
    bn = block_N or (128 if 128 <= max_tile and (wide or 0 < page_size <= _cuda.BAL_WIDE_MAX_PAGE) else 64)
    alloc_tiles = -(-max_seqlen // bn)
    per_sm = cfg.get("bal_per_sm") or (1 if wide else _cuda.BAL_CTAS_PER_SM)
    target = max(1, round(float(per_sm) * num_sms))
    mt = _cuda.BAL_MIN_TILES
    ns = min(_cuda._MAX_SPLITS, -(-target // hkv) + 1, max(1, (2 * alloc_tiles + mt) // (2 * mt)))
    uniform_only = pinned or int(cfg.get("eager") or 0) or int(cfg.get("v_split") or 1) > 1
    if (bal is not None and not int(bal)) or (bal is None and (
            batch < 2 or uniform_only or ns <= uniform_splits or not _small_paged_or_long(
            max_seqlen, page_size, uniform_splits, batch * hkv, target, num_sms))):
        if cfg.get("bal_per_sm") is not None:
            raise ValueError(f"config bal_per_sm={cfg['bal_per_sm']} on a plan that is not balanced (balanced=1 "
                             "makes it one)")
        return None
    return bn, max(ns, 2), target


def _plan_key(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, config):
    cfg = None
    if config:
        cfg = tuple(sorted(config.items())) if isinstance(config, dict) else config
    bt = None if block_table is None else (block_table.shape, block_table.dtype, block_table.device)
    return (q.shape, q.dtype, q.device, q.stride(), k_cache.shape, k_cache.dtype, k_cache.device, v_cache.shape,
            v_cache.dtype, v_cache.device, cache_seqlens.shape, cache_seqlens.device, bt, softmax_scale, cfg)


class _Launch:
    """A plan's compiled kernel and its split workspaces, made once per shape and reused by every call."""

    __slots__ = ("plan", "main", "dummy_bt", "opart", "lse", "cnt")

    def __init__(self, q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, config):
        _check(q, k_cache, v_cache, cache_seqlens, block_table)
        p = self.plan = _cuda_plan(q, k_cache, block_table, softmax_scale, config)
        self.main = _cuda.fast_call(_cuda.get_decode(p, _cuda.cuda_target(q.device)))
        B, dev = q.shape[0], q.device
        self.dummy_bt = self.opart = self.lse = self.cnt = None
        if not p.paged:  # placeholder block table: the contiguous kernel never reads it
            self.dummy_bt = torch.zeros((B, 1), dtype=torch.int32, device=dev)
        if p.split:  # calls are ordered on the stream, so one plan's calls share these
            self.opart = torch.empty((B, p.hq, p.num_splits, p.d), dtype=torch.float32, device=dev)
            self.lse = torch.empty((B, p.hq, p.num_splits), dtype=torch.float32, device=dev)
        if p.counter:  # arrival counters of the last-CTA merge; each call leaves them at 0 again
            self.cnt = torch.zeros((B, p.hkv), dtype=torch.int32, device=dev)


_LAUNCHES: dict = {}


def _launch(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, config) -> _Launch:
    """The cached launch of a shape/dtype/device/config: validation, plan, kernels and workspaces resolved once, so a
    call costs a dict lookup plus the kernel launch."""
    key = _plan_key(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, config)
    lc = _LAUNCHES.get(key)
    if lc is None:
        lc = _Launch(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, config)
        if len(_LAUNCHES) > 1024:
            _LAUNCHES.clear()
        _LAUNCHES[key] = lc
    return lc


def _run_cuda(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, config):
    lc = _launch(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, config)
    p = lc.plan
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
        bt = lc.dummy_bt
    switch = dev.index is not None and dev.index != torch.cuda.current_device()
    if switch:
        prev = torch.cuda.current_device()
        torch.cuda.set_device(dev)
    try:
        out = torch.empty((B, p.hq, p.d), dtype=q.dtype, device=dev)
        if not p.split:
            lc.main(q3, k, v, lens, bt, out)
        elif p.counter:
            lc.main(q3, k, v, lens, bt, lc.opart, lc.lse, lc.cnt, out)
        else:  # split + combine, one host call
            lc.main(q3, k, v, lens, bt, lc.opart, lc.lse, out)
    finally:
        if switch:
            torch.cuda.set_device(prev)
    return out.view(B, 1, p.hq, p.d)


def plan_info(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None, config=None) -> dict:
    """The resolved plan of a call (kernel, block_N, num_splits, ...; CPU: the C-target path), for reports."""
    if not q.is_cuda:
        return {"path": "c-target"}
    return _plan_fields(_launch(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, config).plan)


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


def _profile_plan(case: dict, device: dict, config=None):
    dev = _dev.from_profile(device)
    q, k, bt = _meta_call(case)
    _check(q, k, k, torch.empty((q.shape[0],), dtype=torch.int32, device="meta"), bt)
    return _cuda_plan(q, k, bt, None, config, device=dev), dev


def device_plan(case: dict, device: dict, config=None) -> dict:
    """The plan this kernel resolves for a case on a device given by its profile (a dict: name, vendor, arch, units,
    warp_size, smem_per_unit_bytes, l2_bytes), on any machine: what it would run there. plan_info's fields, the
    kernels it launches, its shared memory a CTA (tl_decode_cuda.smem_bytes) and the device facts it read."""
    p, dev = _profile_plan(case, device, config)
    return {**_plan_fields(p), "kernels": [p.kernel],
            "smem_bytes": _cuda.smem_bytes(p.G, p.d, p.block_N, p.v_split, p.counter, p.threads),
            "device": dev.name, "backend": dev.backend, "arch": dev.arch, "units": dev.units,
            "warp_size": dev.warp_size, "smem_per_unit": dev.smem_per_unit, "l2_bytes": dev.l2_bytes}


def build_plan(case: dict, device: dict, config=None) -> None:
    """Compile the kernel device_plan(case, device, config) resolves into TileLang's disk cache for the profile's
    arch, with no GPU (TileLang's lowering and nvcc only, no CUDA context): `prepare` of that shape on that device
    then loads it instead of compiling it. A profile of another backend is a ValueError."""
    p, dev = _profile_plan(case, device, config)
    if dev.backend != "cuda":
        raise ValueError(f"build_plan compiles for CUDA devices; {dev.name} is {dev.backend}")
    _cuda.get_decode(p, _cuda.cuda_target(arch=dev.arch))


def lower_plan(case: dict, device: dict, target, config=None) -> dict:
    """device_plan's kernels lowered for a TileLang target (e.g. "sm_90a", or {"kind": "hip", "mcpu": "gfx942"}, a
    wave64 target this TileLang has, for a device whose own backend it lacks), without a device: {"plan":
    device_plan's dict, "kernels": {"main": {"source", "dyn_smem_bytes"}}} (a combine kernel is in main's source)."""
    p, _ = _profile_plan(case, device, config)
    return {"plan": device_plan(case, device, config), "kernels": _cuda.lower(p, target)}


def _plan_fields(p: _cuda.Plan) -> dict:
    return {"path": "cuda", "kernel": p.kernel, "plan_class": p.plan_class, "block_N": p.block_N,
            "num_splits": p.num_splits, "threads": p.threads, "eager": p.eager, "last_cta": p.last_cta,
            "balanced": p.balanced, "v_split": p.v_split, "red_batch": p.red_batch, "red_once": p.red_once,
            "pdl": p.pdl, "fast_math": p.fast_math, "tile_page": p.tile_page, "even_split": p.even_split,
            "k_clamp": p.k_clamp,
            "comb_unroll": p.comb_unroll, "paged": p.paged, "page_size": p.page_size}


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
        _launch(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, config)
        return
    _check(q, k_cache, v_cache, cache_seqlens, block_table)
    if q.device.type == "cpu":
        _check_config(config)
        _cpu.prepare(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, config)
    else:
        raise ValueError(f"unsupported device {q.device}")


def configs(case: dict) -> list:
    """Tunable CUDA configs for one shape, each key of _CFG_KEYS among them; the first entry is the plan's default.

    block_N / num_splits / threads 0 mean "the plan's rule" (tl_decode_cuda.choose_tiling, default_threads). Then
    block_N 64 / 128 x num_splits 1-128 (up to the range's tiles); one split also with a row's V over two CTAs
    (v_split 2); from EVEN_MIN_SPLITS splits on, each with both merges named (last_cta 0 and 1: one of them is the
    device's default, so the bare count is not listed again) and with even split ranges and the eager start off
    (even_split applies to plans that are not eager; 64 even splits of case 14's 481 tiles: 1.017x over its tuned 32);
    the balanced kernel at 1-3 CTAs a unit; the softmax's reductions one row at a time.
    """
    seqlen = int(case.get("seqlen_k", 1) or 1)
    out = [{"block_N": 0, "num_splits": 0, "threads": 0}]
    for bn in (64, 128):
        n_tiles = -(-seqlen // bn)
        for ns in (1, 2, 4, 8, 16, 32, 64, 128):
            if ns > n_tiles:
                continue
            pin = {"block_N": bn, "num_splits": ns, "threads": 128}
            if ns < EVEN_MIN_SPLITS:
                out.append(pin)
            else:  # both merges, named: the bare pin would repeat the device's own (last_cta_default)
                out += [{**pin, "last_cta": 0}, {**pin, "last_cta": 1}]
                if n_tiles % ns:  # even ranges differ from ceil ranges only then
                    out.append({**pin, "eager": 0, "even_split": 1})
            if ns == 1:
                out.append({**pin, "v_split": 2})
    out += [{"balanced": 1, "bal_per_sm": n} for n in (1, 2, 3)] + [{"red_batch": 1}]
    return out


# ----------------------------------------------------------------------------------------------
# GPU-less checks of the CUDA kernels
# ----------------------------------------------------------------------------------------------
def build_cuda_source(**shape) -> str:
    """CUDA C++ of one plan's kernels for sm_90a, lowered without a GPU (tl_decode_cuda.kernel_plan's keys: dtype
    ("float16"/"bfloat16"), hq, hkv, d, paged, page_size, block_N, threads, split, scale, eager, last_cta, balanced,
    v_split, ..., and arch ("sm_90a"))."""
    return _cuda.build_cuda_source(**shape)


def compile_cuda_check(**shape) -> dict:
    """Lower and nvcc-compile one plan's kernels for sm_90a without a GPU (build_cuda_source's keys): {"main":
    cubin_bytes, registers, spill_bytes, dyn_smem_bytes, ptxas_log, source} (a combine kernel is in main's module)."""
    return _cuda.compile_cuda_check(**shape)
