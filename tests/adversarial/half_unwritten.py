"""Broken: allocates the output with torch.empty and writes only the first half of the batch.

Expected: nan_inf (the allocator is poisoned with NaN) or incorrect_numerical (whatever the
unwritten memory held).
"""

import torch

from _ref import attention

BACKEND = "torch"


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):
    out = torch.empty_like(q)
    full = attention(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale)
    half = max(1, q.shape[2] // 2)
    out[:, :, :half] = full[:, :, :half]
    return out
