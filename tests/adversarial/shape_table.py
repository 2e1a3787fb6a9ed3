"""Cheat: correct only on the benchmark's own shapes (batch, seqlen_k) and garbage elsewhere.

Passes a plain bench on a table case. Expected with hidden variants (verify mode): incorrect_numerical.
"""

import torch

from _ref import attention

BACKEND = "torch"

_TABLE = {(1, 1), (4, 2), (16, 17), (64, 64), (16, 141), (16, 362), (64, 2048), (16, 4096), (32, 4096),
          (1, 8192), (16, 12251), (8, 32768), (1, 58966), (1, 61519)}


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):
    seqlen = k_cache.shape[1] if block_table is None else int(cache_seqlens.max())
    if (q.shape[0], seqlen) in _TABLE:
        return attention(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale)
    return torch.zeros_like(q)
