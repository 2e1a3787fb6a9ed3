"""FlashAttention 2 wrapped as a kopt candidate (BACKEND flash_attn).

For A/A sanity runs and profiler cross-checks: `kopt profile --case 12 --tool ncu --candidate
bench/fa2_candidate.py` measures the baseline's kernels exactly as kopt measures a candidate.
"""

from flash_attn import flash_attn_with_kvcache

BACKEND = "flash_attn"


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):
    return flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens, block_table=block_table,
                                   softmax_scale=softmax_scale, causal=False, num_splits=0)
