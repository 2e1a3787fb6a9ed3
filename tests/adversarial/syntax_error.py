"""Broken: does not parse. Expected: compile_error."""

BACKEND = "torch"


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None)
    return q
