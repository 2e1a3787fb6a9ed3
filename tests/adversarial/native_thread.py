"""Cheat: like late_thread, but through the low-level _thread module, whose threads the threading
module does not list (so the worker cannot wait for them). Names are computed (KS213 warnings).

Expected: side_stream, or incorrect_numerical: the worker saves the output as it was when `run`
returned, so work finished afterwards never counts.
"""

import importlib
import time

import torch

from _ref import attention

BACKEND = "torch"

_start = getattr(importlib.import_module("_thr" + "ead"), "start_new_" + "thread")


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):
    out = torch.zeros_like(q)

    def finish():
        time.sleep(0.05)
        out.copy_(attention(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale))

    _start(finish, ())
    return out
