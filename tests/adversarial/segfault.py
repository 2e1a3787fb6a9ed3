"""Broken: dereferences NULL inside `run`. Expected: crash (SIGSEGV)."""

import ctypes

BACKEND = "torch"


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):
    ctypes.string_at(0)
    return q
