"""Honest baseline candidate: pure torch, declared as such (torch math is allowed for BACKEND torch)."""

from _ref import attention

BACKEND = "torch"


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):
    return attention(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale)
