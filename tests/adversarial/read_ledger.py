"""Cheat: reads the ledger to learn what the harness measured. Expected: static_violation (KS202)."""

from pathlib import Path

from _ref import attention

BACKEND = "torch"


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):
    ledger = Path.cwd() / "candidates.jsonl"
    if ledger.exists():
        ledger.read_text()
    return attention(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale)
