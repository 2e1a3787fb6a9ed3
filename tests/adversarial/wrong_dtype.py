"""Broken: returns float32 instead of q.dtype. Expected: incorrect_dtype."""

from _ref import attention

BACKEND = "torch"


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):
    return attention(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale).float()
