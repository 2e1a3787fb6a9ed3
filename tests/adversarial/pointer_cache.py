"""Cheat: memoizes outputs by input pointers, so repeated (timed) calls are free.

Expected: stale_output (the refill check rewrites the same buffers with new values).
"""

from _ref import attention

BACKEND = "torch"

_MEMO = {}


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):
    key = (q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr())
    if key not in _MEMO:
        _MEMO[key] = attention(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale)
    return _MEMO[key].clone()
