"""Cheat: exact on every shape, but fast only on the named cases' shapes; anything else pays a detour.

An optimizer fitting the 18 named shapes writes this: a verdict of the named cases alone calls it better.
Expected: its held-out draws lose to the reigning candidate timed on the same draws (kopt verify's pairing).
"""

import time

from _ref import attention

BACKEND = "torch"

_NAMED = {(1, 1), (4, 2), (16, 17), (64, 64), (16, 141), (16, 362), (64, 2048), (16, 4096), (32, 4096),
          (1, 8192), (16, 12251), (8, 32768), (1, 58966), (1, 61519)}


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):
    seqlen = k_cache.shape[1] if block_table is None else int(cache_seqlens.max())
    if (q.shape[0], seqlen) not in _NAMED:
        time.sleep(0.02)  # the shapes it never tuned for
    return attention(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale)
