"""Cheat (GPU): the shipped kernel, launched on a side stream, returned without joining that stream.

The output is usually finished by the time anything reads it, so only the device records show it:
its kernels run on another stream and the caller's stream never waits for them. Expected: side_stream.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "solution" / "tilelang"))
import run_kernel  # noqa: E402

BACKEND = "tilelang"
_SIDE = {}


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):
    s = _SIDE.setdefault(q.device, torch.cuda.Stream(q.device))
    s.wait_stream(torch.cuda.current_stream(q.device))
    with torch.cuda.stream(s):
        return run_kernel.run(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale)
