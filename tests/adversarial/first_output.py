"""Cheat: computes once and returns that same tensor for every later call. Expected: stale_output."""

from _ref import attention

BACKEND = "torch"

_FIRST = []


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):
    if not _FIRST:
        _FIRST.append(attention(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale))
    return _FIRST[0]
