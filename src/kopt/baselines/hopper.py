"""The Hopper peers: FlashAttention-3 and FlashInfer decode, behind their import guards.

Each adapter maps the candidate contract's inputs (q [B, 1, Hq, D], contiguous [B, S, Hkv, D] or paged
[pages, page, Hkv, D] + block_table) onto the library's own call, and returns NA with the reason when
the library is missing, was built without what the case needs, or the device is not a GPU.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Optional

from kopt.baselines.base import Baseline, dist_version, prepared, unavailable
from kopt.cases import Case, DType
from kopt.workload import Workload

#: FA3's two builds: the `hopper/` build of flash-attention, and the forward-only `fa3-fwd` wheel.
FA3_MODULES = (("flash_attn_interface", "flash_attn_3", ("flash_attn_3", "flash-attn-3")),
               ("fa3_fwd_interface", "fa3_fwd", ("fa3-fwd", "fa3_fwd")))
#: FlashInfer's recommended scratch buffer for its split-KV plan (its docs and benchmarks use 128 MiB).
FLASHINFER_WORKSPACE = 128 << 20
#: The page a contiguous cache is handed to FlashInfer in (kopt.baselines.hopper.contiguous_page).
FLASHINFER_CONTIG_PAGE = 16


def _capability() -> Optional[tuple[int, int]]:
    """(major, minor) of the current CUDA device, None when there is none."""
    try:
        import torch

        return tuple(torch.cuda.get_device_capability())
    except Exception:
        return None


def _fa3_module():
    """(module, label) of the first FA3 build that imports, or (None, reason)."""
    errors = []
    for mod_name, label, dists in FA3_MODULES:
        try:
            mod = importlib.import_module(mod_name)
        except Exception as e:
            errors.append(f"{mod_name}: {type(e).__name__}")
            continue
        ver = dist_version(*dists) or getattr(mod, "__version__", None) or "unknown"
        return mod, f"{label}-{ver}"
    return None, "FlashAttention-3 not importable (" + "; ".join(errors) + ")"


def _fa3_flags() -> dict:
    """The build flags FA3 was compiled with (its generated flash_attn_config), {} when it has none."""
    try:
        return dict(importlib.import_module("flash_attn_config").CONFIG["build_flags"])
    except Exception:
        return {}


def fa3_supports(case: Case, flags: dict, cap: Optional[tuple[int, int]]) -> Optional[str]:
    """None when this FA3 build runs the case on this device, else the reason it does not."""
    v = case.variant
    if cap is not None and cap[0] != 9 and (cap[0] < 8 or flags.get("FLASHATTENTION_DISABLE_SM8x", True)):
        return f"FA3 is built for sm_90; this device is sm_{cap[0]}{cap[1]}"
    if v.dtype == DType.fp16 and flags.get("FLASHATTENTION_DISABLE_FP16"):
        return "fp16 compiled out of this FA3 build (bf16 only)"
    if v.page_size and flags.get("FLASHATTENTION_DISABLE_PAGEDKV"):
        return "paged KV compiled out of this FA3 build"
    if flags.get(f"FLASHATTENTION_DISABLE_HDIM{v.head_dim}"):
        return f"head_dim {v.head_dim} compiled out of this FA3 build"
    return None


def fa3(case: Case, device: str) -> Baseline:
    """FA3's flash_attn_with_kvcache with its own split and PackGQA heuristics (num_splits=0)."""
    if device != "cuda":
        return unavailable("fa3", "needs CUDA")
    mod, label = _fa3_module()
    if mod is None:
        return unavailable("fa3", label)
    why = fa3_supports(case, _fa3_flags(), _capability())
    if why:
        return unavailable(label, why)

    def fn(w: Workload):
        # FA3 names the block table page_table; a scheduler, the main kernel and a combine may all run.
        return mod.flash_attn_with_kvcache(w.q, w.k_cache, w.v_cache, cache_seqlens=w.cache_seqlens,
                                           page_table=w.block_table, softmax_scale=w.softmax_scale,
                                           causal=False, num_splits=0)

    return Baseline(label, fn)


@dataclass
class FlashInferPages:
    """A cache as FlashInfer's paged NHD cache: page size, indptr / indices / last_page_len (int32, on the
    cache's device), and K and V as [pages, page, Hkv, D] (views of the workload's own tensors)."""

    page_size: int
    indptr: object
    indices: object
    last_page_len: object
    k: object
    v: object


def contiguous_page(seqlen_k: int) -> int:
    """The page a contiguous cache is described in: 16 (vLLM's default page) or, where sequences of seqlen_k rows
    do not start on a 16-row boundary, the largest power of two that divides seqlen_k (1 at worst, SGLang's page).
    FlashInfer's scheduler splits the KV at page granularity, so one page per sequence would forbid split-KV."""
    page = FLASHINFER_CONTIG_PAGE
    while seqlen_k % page:
        page //= 2
    return page


def flashinfer_pages(w: Workload) -> FlashInferPages:
    """w's cache as FlashInfer's paged NHD cache, without a copy.

    A contiguous [B, S, Hkv, D] cache is viewed as B * S / P pages of P = contiguous_page(S) rows (sequence i owns
    pages i * S / P, ...): the memory the candidate reads. A paged cache keeps its pages. Sequence i owns its first
    n_i = ceil(len_i / page) pages, its last one holding len_i - (n_i - 1) * page tokens."""
    import torch

    lens = w.cache_seqlens.to(torch.int32)
    b = lens.shape[0]
    dev = w.k_cache.device
    if w.block_table is None:
        s, rest = int(w.k_cache.shape[1]), tuple(w.k_cache.shape[2:])
        page = contiguous_page(s)
        per = s // page
        table = torch.arange(b * per, dtype=torch.int32, device=dev).view(b, per)
        k, v = (x.view(b * per, page, *rest) for x in (w.k_cache, w.v_cache))
    else:
        page, table, k, v = int(w.k_cache.shape[1]), w.block_table, w.k_cache, w.v_cache
    n = (lens + page - 1) // page
    indptr = torch.zeros(b + 1, dtype=torch.int32, device=dev)
    indptr[1:] = torch.cumsum(n, 0)
    used = torch.arange(table.shape[1], device=dev)[None, :] < n[:, None]
    indices = table[used].to(torch.int32).contiguous()  # row-major: each sequence's pages in order
    return FlashInferPages(page, indptr, indices, (lens - (n - 1) * page).to(torch.int32), k, v)


def flashinfer(case: Case, device: str) -> Baseline:
    """FlashInfer's BatchDecodeWithPagedKVCacheWrapper (tensor cores, as for GQA); plan() in the
    preparation, run() the timed call. Without the flashinfer package: the same kernels and scheduler through
    kopt's small C build of them (kopt.baselines.flashinfer_capi), labelled ...-capi."""
    if device != "cuda":
        return unavailable("flashinfer", "needs CUDA")
    try:
        fi = importlib.import_module("flashinfer")
    except Exception as e:
        return _flashinfer_capi(case, f"flashinfer not importable ({type(e).__name__})")
    label = f"flashinfer-{dist_version('flashinfer-python', 'flashinfer') or getattr(fi, '__version__', 'unknown')}"
    wrapper_cls = getattr(fi, "BatchDecodeWithPagedKVCacheWrapper", None)
    if wrapper_cls is None or not hasattr(wrapper_cls, "plan"):
        return unavailable(label, "this flashinfer has no BatchDecodeWithPagedKVCacheWrapper.plan (needs >= 0.2)")
    hq, hkv, d = case.q_heads, case.kv_heads, case.variant.head_dim

    def prepare(w: Workload):
        import torch

        p = flashinfer_pages(w)
        scratch = torch.empty(FLASHINFER_WORKSPACE, dtype=torch.uint8, device=w.q.device)
        dec = wrapper_cls(scratch, "NHD", use_tensor_cores=True)
        dec.plan(p.indptr, p.indices, p.last_page_len, hq, hkv, d, p.page_size, pos_encoding_mode="NONE",
                 q_data_type=w.q.dtype, kv_data_type=w.k_cache.dtype, sm_scale=w.softmax_scale)
        q, kv = w.q[:, 0], (p.k, p.v)  # q [B, Hq, D]: a view, the decode step's one token
        return lambda: dec.run(q, kv).unsqueeze(1)

    return prepared(label, prepare)


def _flashinfer_capi(case: Case, why: str) -> Baseline:
    """FlashInfer's decode through the C build, or NA saying why neither it nor the package is there."""
    from kopt.baselines import flashinfer_capi as capi

    lib, reason = capi.load()
    if lib is None:
        return unavailable("flashinfer", f"{why}; {reason}")
    v = case.variant
    if capi.variant(v.dtype.value, v.head_dim) not in lib.variants:
        return unavailable(lib.label, f"{v.dtype.value} head_dim {v.head_dim} not in this FlashInfer C build "
                                      f"({', '.join(lib.variants)})")
    cap = _capability()
    if cap is not None and cap[0] != 9:
        return unavailable(lib.label, f"the FlashInfer C build is for sm_90a; this device is sm_{cap[0]}{cap[1]}")
    hq, hkv, d = case.q_heads, case.kv_heads, v.head_dim

    def prepare(w: Workload):
        run = capi.Decoder(lib, FLASHINFER_WORKSPACE).plan(flashinfer_pages(w), hq, hkv, d, w.q.dtype,
                                                           w.softmax_scale)
        q = w.q[:, 0]  # [B, Hq, D]: a view, as for the package
        return lambda: run(q).unsqueeze(1)

    return prepared(lib.label, prepare, note=f"FlashInfer {lib.version}'s own kernels and scheduler, C build")
