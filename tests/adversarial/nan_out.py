"""Broken: NaN in the output. Expected: nan_inf."""

from _ref import attention

BACKEND = "torch"


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):
    out = attention(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale)
    out[0, 0, 0, 0] = float("nan")
    return out
