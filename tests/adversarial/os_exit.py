"""Broken: exits the process with status 0 during `run`. Expected: crash (no result, not success)."""

import os

BACKEND = "torch"


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):
    os._exit(0)
