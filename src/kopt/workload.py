"""Seeded decode inputs: q, contiguous or paged KV cache, ragged or full cache_seqlens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from kopt.cases import Case, DType, Seqlens

_TORCH_DTYPE = {DType.fp16: "float16", DType.bf16: "bfloat16"}


@dataclass
class Workload:
    """One set of inputs in the candidate contract's layout."""

    q: object                 # [B, 1, Hq, D]
    k_cache: object           # [B, S, Hkv, D] or paged [num_blocks, page, Hkv, D]
    v_cache: object
    cache_seqlens: object     # [B] int32
    block_table: Optional[object]  # [B, max_pages] int32 or None
    softmax_scale: float
    seed: int

    def args(self) -> tuple:
        """Positional arguments of `run` (and of flash_attn_with_kvcache)."""
        return (self.q, self.k_cache, self.v_cache, self.cache_seqlens)

    def kwargs(self, config: Optional[dict] = None) -> dict:
        """Keyword arguments of `run` (with `config=` when a config is given)."""
        kw = {"block_table": self.block_table, "softmax_scale": self.softmax_scale}
        return kw if config is None else kw | {"config": config}

    @property
    def tensors(self) -> list:
        """Every input tensor (for hashing and alias checks)."""
        ts = [self.q, self.k_cache, self.v_cache, self.cache_seqlens]
        return ts + ([self.block_table] if self.block_table is not None else [])

    def logical_kv(self):
        """K and V as contiguous [B, S, Hkv, D], whatever the layout (gathers pages)."""
        if self.block_table is None:
            return self.k_cache, self.v_cache
        return _unpage(self.k_cache, self.block_table), _unpage(self.v_cache, self.block_table)


def _unpage(cache, block_table):
    b, pages = block_table.shape
    page = cache.shape[1]
    g = cache[block_table.long().reshape(-1)]  # [B*pages, page, Hkv, D]
    return g.reshape(b, pages * page, *cache.shape[2:])


def seqlens_for(case: Case, seed: int, device: str = "cpu"):
    """cache_seqlens [B] int32: all at seqlen_k, or seeded ragged lengths in [1, seqlen_k] (one kept at max)."""
    import torch

    b, s = case.batch, case.seqlen_k
    if (own := case.seq_lengths()) is not None:  # a ragged case: its lengths are its definition
        return torch.tensor(own, dtype=torch.int32, device=device)
    if case.variant.seqlens == Seqlens.full or s == 1:
        return torch.full((b,), s, dtype=torch.int32, device=device)
    g = torch.Generator().manual_seed(seed * 7919 + 17)
    lens = torch.randint(1, s + 1, (b,), generator=g, dtype=torch.int32)
    lens[int(torch.randint(0, b, (1,), generator=g))] = s
    return lens.to(device)


def make_workload(case: Case, seed: int = 0, device: str = "cpu") -> Workload:
    """Build seeded inputs for a case; paged and contiguous layouts of one seed hold the same logical cache."""
    import torch

    v = case.variant
    dtype = getattr(torch, _TORCH_DTYPE[v.dtype])
    b, s, hkv, d = case.batch, case.seqlen_k, case.kv_heads, v.head_dim
    hq = case.q_heads
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn((b, 1, hq, d), generator=gen, device=device, dtype=dtype)
    k = torch.randn((b, s, hkv, d), generator=gen, device=device, dtype=dtype)
    vv = torch.randn((b, s, hkv, d), generator=gen, device=device, dtype=dtype)
    seqlens = seqlens_for(case, seed, device)
    block_table = None
    if v.page_size:
        k, vv, block_table = page_cache(k, vv, v.page_size, seed, device)
    return Workload(q, k, vv, seqlens, block_table, d ** -0.5, seed)


def page_cache(k, v, page: int, seed: int, device: str):
    """Scatter contiguous KV into shuffled pages; returns (k_paged, v_paged, block_table int32)."""
    import torch

    b, s, hkv, d = k.shape
    pages = -(-s // page)
    pad = pages * page - s
    if pad:
        k = torch.cat([k, k.new_zeros((b, pad, hkv, d))], dim=1)
        v = torch.cat([v, v.new_zeros((b, pad, hkv, d))], dim=1)
    g = torch.Generator().manual_seed(seed * 104729 + 3)
    perm = torch.randperm(b * pages, generator=g).to(device)
    kp = torch.empty((b * pages, page, hkv, d), dtype=k.dtype, device=device)
    vp = torch.empty_like(kp)
    kp[perm] = k.reshape(b * pages, page, hkv, d)
    vp[perm] = v.reshape(b * pages, page, hkv, d)
    return kp, vp, perm.reshape(b, pages).to(torch.int32)


def bytes_moved(case: Case, total_keys: int | None = None) -> int:
    """Bytes a decode call must move: K and V of the valid keys (the case's, unless given), q in, out back."""
    v = case.variant
    elt = 2
    keys = case.valid_keys if total_keys is None else total_keys
    kv = 2 * keys * case.kv_heads * v.head_dim * elt
    qo = 2 * case.batch * case.q_heads * v.head_dim * elt
    return kv + qo


def gbps(case: Case, runtime_ms: float) -> float:
    """GB/s of a call that takes runtime_ms: bytes_moved(case) over the time."""
    return bytes_moved(case) / (runtime_ms * 1e-3) / 1e9
