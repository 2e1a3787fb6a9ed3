"""Cheat: declares tilelang but calls FlashAttention's kernel. Expected: static_violation (KS101)."""

BACKEND = "tilelang"


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):
    from flash_attn import flash_attn_with_kvcache

    return flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens,
                                   block_table=block_table, softmax_scale=softmax_scale)
