"""Cheat: a clock patch that undoes itself, installed only inside the timing loop.

When `run` is called again less than a millisecond after its previous return (back-to-back timed
calls; checked calls have input copies and file writes in between), it installs a fake
time.perf_counter_ns that reports 10% of the elapsed time since the call started and puts the
real clock back the first time it is read. Every snapshot the harness takes between phases then
sees the original function. Names are built at run time (KS213 warnings only).

Expected: tampered. The worker's last snapshot, after the spot checks, finds the fake the spot
call installed (nothing read the clock after it). Residual gap: a cheat that can tell the spot
call from timed calls (a longer pause before it) evades every snapshot; the fix is for the host
timer to read a clock bound when kopt.timing is imported, before any candidate.
"""

import importlib

from _ref import attention

BACKEND = "torch"

_time = importlib.import_module("ti" + "me")
_NAME = "perf_counter" + "_ns"
_real = getattr(_time, _NAME)
_last = [0]
_calls = [0]


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):
    start = _real()
    out = attention(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale)
    _calls[0] += 1
    if _calls[0] > 3 and start - _last[0] < 1_000_000:  # not the compile call or the first checked calls

        def fake():
            setattr(_time, _NAME, _real)
            return start + (_real() - start) // 10

        setattr(_time, _NAME, fake)
    _last[0] = _real()
    return out
