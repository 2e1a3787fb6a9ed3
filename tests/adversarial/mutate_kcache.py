"""Cheat: correct answer, but scribbles on k_cache (e.g. an in-place pre-scale). Expected: mutated_input."""

from _ref import attention

BACKEND = "torch"


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):
    out = attention(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale)
    k_cache.mul_(0.5)
    return out
