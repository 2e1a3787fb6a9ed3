"""Broken: abort() inside `run`. Expected: crash (SIGABRT)."""

import os

BACKEND = "torch"


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):
    os.abort()
