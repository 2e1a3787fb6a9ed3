"""Broken: `run` raises. Expected: runtime_error."""

BACKEND = "torch"


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):
    raise RuntimeError("kernel launch failed (deliberately)")
