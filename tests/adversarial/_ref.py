"""Honest pure-torch decode attention shared by the adversarial candidates (not a candidate itself)."""

import torch


def attention(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):
    """fp32 GQA decode attention over a contiguous or paged cache, masked to each sequence's length."""
    if block_table is not None:
        b, pages = block_table.shape
        idx = block_table.long().reshape(-1)
        k = k_cache[idx].reshape(b, pages * k_cache.shape[1], *k_cache.shape[2:])
        v = v_cache[idx].reshape(b, pages * v_cache.shape[1], *v_cache.shape[2:])
    else:
        k, v = k_cache, v_cache
    B, _, Hq, D = q.shape
    Hkv = k.shape[2]
    scale = softmax_scale if softmax_scale is not None else D ** -0.5
    qf = q.float().reshape(B, Hkv, Hq // Hkv, D)
    kf = k.float().permute(0, 2, 1, 3)
    vf = v.float().permute(0, 2, 1, 3)
    s = torch.einsum("bhgd,bhsd->bhgs", qf, kf) * scale
    pad = torch.arange(k.shape[1], device=q.device)[None, :] >= cache_seqlens.long()[:, None]
    s = s.masked_fill(pad[:, None, None, :], float("-inf"))
    o = torch.einsum("bhgs,bhsd->bhgd", s.softmax(-1), vf)
    return o.reshape(B, 1, Hq, D).to(q.dtype)
