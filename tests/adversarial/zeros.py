"""Cheat: returns zeros of the right shape and dtype. Expected: incorrect_numerical."""

import torch

BACKEND = "torch"


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):
    return torch.zeros_like(q)
