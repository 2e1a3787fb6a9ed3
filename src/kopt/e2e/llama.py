"""A Llama-architecture decoder from Hugging Face transformers, built from a workload-library model's attention shape
with random weights from a seed (no weights are downloaded), and kopt's attention backend registered in it.

Sizes: hidden = query heads x head dim (TinyLlama's own 2048 for its shape), intermediate 2.75 x hidden (TinyLlama's
5632), vocabulary 32000; on a CPU a tiny decoder of the same attention (hidden 256, vocabulary 1024). The model's
forward runs without transformers' cache (use_cache=False): kopt's attention function owns the KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass

from kopt.errors import UsageError

#: transformers releases with the attention-function registry (ALL_ATTENTION_FUNCTIONS) kopt registers in.
MIN_TRANSFORMERS = "4.48"
VOCAB, TINY_VOCAB, TINY_HIDDEN = 32000, 1024, 256


def transformers_version() -> str:
    """The installed transformers' version; a usage error naming the extra when it is missing or too old."""
    try:
        import transformers
    except ImportError:
        raise UsageError("kopt e2e needs Hugging Face transformers: pip install -e \".[e2e]\"") from None
    try:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS  # noqa: F401
    except ImportError:
        raise UsageError(f"kopt e2e needs transformers >= {MIN_TRANSFORMERS} (its attention registry); found "
                         f"{transformers.__version__}") from None
    return transformers.__version__


def dims(q_heads: int, kv_heads: int, head_dim: int, layers: int, tiny: bool) -> dict[str, int]:
    """The decoder's sizes from the attention shape (module docstring)."""
    hidden = q_heads * head_dim
    if tiny:
        hidden = min(hidden, TINY_HIDDEN)
    inter = -(-int(2.75 * hidden) // 64) * 64
    return {"hidden": hidden, "intermediate": inter, "vocab": TINY_VOCAB if tiny else VOCAB, "layers": layers,
            "heads": q_heads, "kv_heads": kv_heads, "head_dim": head_dim}


def register() -> None:
    """Register kopt's attention function (kopt.e2e.kvcache.attention) under ATTN_NAME, with the library's own SDPA
    kept for the prefill."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from kopt.e2e import kvcache

    kvcache.ACTIVE.sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
    try:
        from transformers import AttentionInterface

        AttentionInterface.register(kvcache.ATTN_NAME, kvcache.attention)
    except ImportError:  # releases before the public interface: the registry is a dict
        ALL_ATTENTION_FUNCTIONS[kvcache.ATTN_NAME] = kvcache.attention


@dataclass
class Built:
    """The model and its facts."""

    lm: object        # LlamaForCausalLM
    dims: dict
    max_context: int
    fitted: object = None  # kopt.e2e.fit.Fitted when the decoder was fitted


def build(d: dict, max_context: int, dtype, device: str, seed: int, fit_steps: int = 0, fit_len: int = 0,
          per: int = 0, tail: int = 1) -> Built:
    """LlamaForCausalLM of sizes d, random weights from seed (initialized on the device), fitted for fit_steps steps
    on blocks of `per` tokens in sequences of fit_len (kopt.e2e.fit; in fp32, before the cast to dtype) when
    fit_steps > 0, or loaded from the fit cache when the same fit ran before (kopt.e2e.fit.ENV_CACHE), kopt's
    attention on; a fitted decoder's copy is then checked in dtype on the last `tail` positions (the decoded ones:
    fit.copy_accuracy). Call it outside torch.inference_mode (a fit needs gradients)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from kopt.e2e import kvcache

    register()
    cfg = LlamaConfig(vocab_size=d["vocab"], hidden_size=d["hidden"], intermediate_size=d["intermediate"],
                      num_hidden_layers=d["layers"], num_attention_heads=d["heads"],
                      num_key_value_heads=d["kv_heads"], head_dim=d["head_dim"], max_position_embeddings=max_context,
                      tie_word_embeddings=False, initializer_range=d["hidden"] ** -0.5, attn_implementation="sdpa")
    torch.manual_seed(seed)
    with torch.device(device):
        lm = LlamaForCausalLM(cfg)
    fitted = None
    if fit_steps:
        from kopt.e2e import fit

        kept = fit.cache_file({"dims": d, "max_context": max_context, "dtype": str(dtype), "device": device,
                               "seed": seed, "steps": fit_steps, "len": fit_len, "per": per}, (__file__,))
        fitted = fit.load(lm, kept, dtype, device)
        if fitted is None:
            fitted = fit.fit(lm, fit_steps, fit_len, per, seed, device)
            fit.save(lm.to(dtype), fitted, kept)
    lm = lm.to(dtype).eval()
    lm.requires_grad_(False)
    if fitted is not None:
        fitted.copy_acc = fit.copy_accuracy(lm, fit_len, min(tail, fit_len - per), per, seed, device)
    attn = lm.model.layers[0].self_attn
    if attn.q_proj.out_features != d["heads"] * d["head_dim"]:
        raise UsageError("this transformers release ignores LlamaConfig.head_dim: upgrade transformers")
    lm.config._attn_implementation = kvcache.ATTN_NAME
    return Built(lm, d, max_context, fitted)


def forward(lm, ids, positions):
    """Last-position logits [B, vocab] in fp32 of the decoder on ids [B, T] at positions [B, T] (no HF cache)."""
    out = lm.model(input_ids=ids, position_ids=positions, use_cache=False)
    return lm.lm_head(out.last_hidden_state[:, -1, :]).float()
