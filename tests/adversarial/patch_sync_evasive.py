"""Cheat that evades the static check: patches torch.cuda.synchronize and time.perf_counter
through names built at run time (the static check can only warn, KS213).

Expected: tampered (the child's snapshot of harness entry points sees the replacement).
"""

import importlib

from _ref import attention

BACKEND = "torch"

_time = importlib.import_module("ti" + "me")
_name = "perf" + "_counter"
_real = getattr(_time, _name)
setattr(_time, _name, lambda: _real() * 0.5)
_cuda = importlib.import_module("tor" + "ch.cu" + "da")
setattr(_cuda, "synchro" + "nize", lambda *a, **k: None)


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):
    return attention(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale)
