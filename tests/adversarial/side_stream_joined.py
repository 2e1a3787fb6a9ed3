"""Honest (GPU): the shipped kernel on a side stream, joined to the caller's stream before returning.

The caller's stream waits for the side stream, so whatever the caller enqueues next sees the finished
output. Expected: ok.
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
    main = torch.cuda.current_stream(q.device)
    s.wait_stream(main)
    with torch.cuda.stream(s):
        out = run_kernel.run(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale)
    main.wait_stream(s)
    out.record_stream(main)
    return out
