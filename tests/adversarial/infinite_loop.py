"""Broken: never returns. Expected: timeout."""

BACKEND = "torch"


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):
    n = 0
    while True:
        n += 1
