"""Cheat (GPU): launches the work on a side stream and returns without joining it.

Expected on CUDA: side_stream. The stream is created through a computed name to evade KS210.
"""

import torch

from _ref import attention

BACKEND = "torch"


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):
    out = torch.zeros_like(q)
    side = getattr(torch.cuda, "Str" + "eam")()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        out.copy_(attention(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale))
    return out
