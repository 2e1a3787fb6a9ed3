"""Cheat: returns an unfinished output and lets a background thread fill it in afterwards, so the
timed call looks fast. The thread class is looked up by a computed name, evading KS207.

Expected: side_stream (the worker waits for the candidate's threads, then compares).
"""

import importlib
import time

import torch

from _ref import attention

BACKEND = "torch"

_threads = importlib.import_module("thread" + "ing")
_Thread = getattr(_threads, "Th" + "read")


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):
    out = torch.zeros_like(q)

    def finish():
        time.sleep(0.2)
        out.copy_(attention(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale))

    _Thread(target=finish, daemon=True).start()
    return out
