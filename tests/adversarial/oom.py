"""Broken: asks for an impossible allocation. Expected: oom.

2**62 bytes exceeds any address space, so the allocation fails at once on CPU (without touching
memory, whatever the overcommit policy) and on GPU.
"""

import torch

BACKEND = "torch"


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):
    big = torch.empty(2 ** 62, dtype=torch.uint8, device=q.device)
    return big[: q.numel()].view(q.dtype).reshape(q.shape)
