"""Cheat: declares tilelang but does the attention with torch ops. Expected: static_violation (KS102)."""

import torch

BACKEND = "tilelang"


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):
    B, _, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    qf = q.float().reshape(B, Hkv, Hq // Hkv, D)
    kf = k_cache.float().permute(0, 2, 3, 1)
    s = torch.matmul(qf, kf) * (softmax_scale or D ** -0.5)
    p = torch.softmax(s, dim=-1)
    o = torch.matmul(p, v_cache.float().permute(0, 2, 1, 3))
    return o.reshape(B, 1, Hq, D).to(q.dtype)
