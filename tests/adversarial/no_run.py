"""Broken: no `run`. Expected: compile_error."""

BACKEND = "torch"


def forward(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):
    return q
