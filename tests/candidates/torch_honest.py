"""An honest torch candidate (BACKEND torch): exact attention per sequence, for fast harness tests."""

import torch

BACKEND = "torch"


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):
    b, _, hq, d = q.shape
    if block_table is not None:
        page = k_cache.shape[1]
        k_cache = k_cache[block_table.long()].reshape(b, -1, *k_cache.shape[2:])
        v_cache = v_cache[block_table.long()].reshape(b, -1, *v_cache.shape[2:])
    hkv = k_cache.shape[2]
    scale = softmax_scale or d ** -0.5
    out = torch.empty_like(q)
    for i in range(b):
        n = int(cache_seqlens[i])
        k = k_cache[i, :n].float().repeat_interleave(hq // hkv, dim=1)  # [n, Hq, D]
        v = v_cache[i, :n].float().repeat_interleave(hq // hkv, dim=1)
        s = torch.einsum("hd,nhd->hn", q[i, 0].float(), k) * scale
        out[i, 0] = torch.einsum("hn,nhd->hd", torch.softmax(s, -1), v).to(q.dtype)
    return out
