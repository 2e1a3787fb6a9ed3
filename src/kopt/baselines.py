"""The baseline: flash_attn_with_kvcache where it runs, else a torch implementation labelled as such."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from kopt.cases import Case
from kopt.workload import Workload


@dataclass
class Baseline:
    """A named callable with the candidate contract's signature."""

    name: str           # what ran, e.g. flash_attn-2.8.3, torch-sdpa, torch-cpu
    fn: Callable[[Workload], object]
    note: str = ""      # why this baseline was chosen (e.g. flash-attn missing)


def flash_attn_version() -> Optional[str]:
    """flash-attn's version when it imports, else None."""
    try:
        import flash_attn
    except Exception:
        return None
    return getattr(flash_attn, "__version__", "unknown")


def _fa_supports(case: Case) -> Optional[str]:
    """None when flash-attn 2 handles the case, else the reason it does not."""
    v = case.variant
    if v.head_dim not in (64, 128):
        return f"head_dim {v.head_dim} not in this flash-attn build"
    if v.page_size is not None and v.page_size % 256:
        return f"flash-attn 2 paged KV needs page_size % 256 == 0 (got {v.page_size})"
    return None


def pick(case: Case, device: str, prefer: str = "auto") -> Baseline:
    """flash_attn_with_kvcache(num_splits=0) on CUDA when possible; else torch, never silently."""
    if device == "cpu":
        return Baseline("torch-cpu", torch_attention, "CPU run: torch reference implementation")
    if prefer != "torch":
        ver = flash_attn_version()
        why = "flash-attn not importable" if ver is None else _fa_supports(case)
        if why is None:
            return Baseline(f"flash_attn-{ver}", flash_attn_kvcache)
    else:
        why = "torch baseline requested"
    return Baseline("torch-sdpa", torch_attention, why or "")


def flash_attn_kvcache(w: Workload):
    """FlashAttention 2's decode entry point with its own split heuristic (num_splits=0)."""
    from flash_attn import flash_attn_with_kvcache

    return flash_attn_with_kvcache(
        w.q, w.k_cache, w.v_cache, cache_seqlens=w.cache_seqlens, block_table=w.block_table,
        softmax_scale=w.softmax_scale, causal=False, num_splits=0)


def torch_attention(w: Workload):
    """SDPA in the input dtype over the (gathered) logical cache, masked to each sequence's length."""
    import torch
    import torch.nn.functional as F

    k, v = w.logical_kv()
    s = k.shape[1]
    q = w.q.transpose(1, 2)                       # [B, Hq, 1, D]
    kt, vt = k.transpose(1, 2), v.transpose(1, 2)  # [B, Hkv, S, D]
    mask = torch.arange(s, device=k.device)[None, :] < w.cache_seqlens[:, None].to(k.device)
    out = F.scaled_dot_product_attention(q, kt, vt, attn_mask=mask[:, None, None, :],
                                         scale=w.softmax_scale, enable_gqa=True)
    return out.transpose(1, 2)
