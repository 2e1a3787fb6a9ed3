"""Cheat: slows the clock the harness times with, on import. Expected: static_violation (KS203)."""

import time

from _ref import attention

BACKEND = "torch"

_real = time.perf_counter
time.perf_counter = lambda: _real() * 0.5


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):
    return attention(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale)
