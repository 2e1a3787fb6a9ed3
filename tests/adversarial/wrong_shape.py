"""Broken: drops the singleton query-length dimension. Expected: incorrect_shape."""

from _ref import attention

BACKEND = "torch"


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):
    return attention(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale)[:, 0]
