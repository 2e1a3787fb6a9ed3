"""CPU path: GQA decode attention as a TileLang C-target kernel (tilelang.cpu dialect).

One tile program per (kv_head, batch) handles all G = Hq // Hkv query heads of that KV head, so
each K/V row is read and widened to fp32 once per KV head. Keys are processed in tiles of
``block_N`` with an online (exp2-based) softmax in fp32.

fp16 / bf16 tensors are passed to the kernel as raw 16-bit views (no host copy of the KV cache)
and widened to fp32 inside the kernel with bit arithmetic; the output is written in fp32 and
cast to the query dtype on the host.
"""


import math
import os
import threading

import torch

_LOG2E = 1.4426950408889634
_CACHE: dict = {}
_LOCK = threading.Lock()

# storage kinds the kernel understands
_KIND_OF = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}


def _cpu_compile_flags() -> list:
    flags = ["-O3", "-fno-math-errno", "-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math"]
    # Only ask for AVX2/FMA when this CPU has them (the object is built and run on this host; the
    # flags are part of TileLang's cache key).
    cpu_flags = set()
    if os.path.isfile("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    cpu_flags = set(line.split(":", 1)[1].split())
                    break
    if {"avx2", "fma"} <= cpu_flags:
        flags += ["-mavx2", "-mfma"]
    return flags


def _to_f32(T, x, kind):
    """Widen a loaded storage element to float32 (x is uint16 bits for f16/bf16)."""
    if kind == "f32":
        return x
    if kind == "bf16":
        return T.reinterpret(T.shift_left(T.cast(x, "uint32"), T.uint32(16)), "float32")
    # IEEE half -> float: move exponent/mantissa into place and rescale by 2^112 (handles
    # subnormals exactly), then apply the sign.
    u = T.cast(x, "uint32")
    mag = T.reinterpret(T.shift_left(T.bitwise_and(u, T.uint32(0x7FFF)), T.uint32(13)), "float32") * T.float32(
        5.192296858534828e33
    )
    return T.if_then_else(T.bitwise_and(u, T.uint32(0x8000)) != T.uint32(0), -mag, mag)


def _build(kind: str, hq: int, hkv: int, d: int, paged: bool, page_size: int, block_n: int, scale: float):
    import tilelang.cpu.language as T

    G = hq // hkv
    store = "float32" if kind == "f32" else "uint16"
    acc_t = "float32"
    sm_scale = float(scale) * _LOG2E
    BN = block_n

    batch = T.dynamic("batch")
    max_pages = T.dynamic("max_pages")
    if paged:
        kv_shape = [T.dynamic("num_blocks"), page_size, hkv, d]
    else:
        kv_shape = [batch, T.dynamic("seqlen_k"), hkv, d]

    def kv_index(bt, b, pos):
        """(dim0, dim1) of the cache row holding key `pos` of sequence `b`."""
        if paged:
            return bt[b, pos // page_size], pos % page_size
        return b, pos

    @T.prim_func
    def decode_cpu(
        Q: T.Tensor([batch, hq, d], store),
        K: T.Tensor(kv_shape, store),
        V: T.Tensor(kv_shape, store),
        L: T.Tensor([batch], "int32"),
        BT: T.Tensor([batch, max_pages], "int32"),
        O: T.Tensor([batch, hq, d], "float32"),
    ):
        with T.Kernel(hkv, batch) as (h, b):
            q = T.alloc_local([G, d], acc_t)
            acc = T.alloc_local([G, d], acc_t)
            kt = T.alloc_local([d, BN], acc_t)
            vt = T.alloc_local([BN, d], acc_t)
            s = T.alloc_local([G, BN], acc_t)
            m = T.alloc_local([G], acc_t)
            lsum = T.alloc_local([G], acc_t)
            mx = T.alloc_local([1], acc_t)
            alpha = T.alloc_local([1], acc_t)
            rsum = T.alloc_local([1], acc_t)
            r0 = T.alloc_local([BN], "int32")
            r1 = T.alloc_local([BN], "int32")
            seqlen = L[b]
            for g, j in T.grid(G, d):
                q[g, j] = _to_f32(T, Q[b, h * G + g, j], kind) * T.float32(sm_scale)
                acc[g, j] = T.float32(0)
            for g in T.serial(G):
                m[g] = -T.infinity(acc_t)
                lsum[g] = T.float32(0)
            for t in T.serial(T.ceildiv(seqlen, BN)):
                # physical rows of this tile (positions past the end are clamped, then masked)
                for n in T.serial(BN):
                    i0, i1 = kv_index(BT, b, T.min(t * BN + n, seqlen - 1))
                    r0[n] = i0
                    r1[n] = i1
                for n, j in T.grid(BN, d):
                    kt[j, n] = _to_f32(T, K[r0[n], r1[n], h, j], kind)
                    vt[n, j] = _to_f32(T, V[r0[n], r1[n], h, j], kind)
                for g, n in T.grid(G, BN):
                    s[g, n] = T.float32(0)
                for g, j, n in T.grid(G, d, BN):
                    s[g, n] = s[g, n] + q[g, j] * kt[j, n]
                for g, n in T.grid(G, BN):
                    if t * BN + n >= seqlen:
                        s[g, n] = -T.infinity(acc_t)
                for g in T.serial(G):
                    mx[0] = m[g]
                    for n in T.serial(BN):
                        mx[0] = T.max(mx[0], s[g, n])
                    alpha[0] = T.exp2(m[g] - mx[0])
                    rsum[0] = T.float32(0)
                    for n in T.serial(BN):
                        s[g, n] = T.exp2(s[g, n] - mx[0])
                        rsum[0] = rsum[0] + s[g, n]
                    lsum[g] = lsum[g] * alpha[0] + rsum[0]
                    m[g] = mx[0]
                    for j in T.serial(d):
                        acc[g, j] = acc[g, j] * alpha[0]
                for g, n, j in T.grid(G, BN, d):
                    acc[g, j] = acc[g, j] + s[g, n] * vt[n, j]
            for g, j in T.grid(G, d):
                O[b, h * G + g, j] = T.if_then_else(lsum[g] > T.float32(0), acc[g, j] / lsum[g], T.float32(0))

    return decode_cpu


def get_kernel(kind, hq, hkv, d, paged, page_size, block_n, scale):
    key = (kind, hq, hkv, d, bool(paged), int(page_size) if paged else 0, block_n, float(scale))
    kern = _CACHE.get(key)
    if kern is not None:
        return kern
    with _LOCK:
        kern = _CACHE.get(key)
        if kern is None:
            import tilelang
            from tilelang.transform import PassConfigKey

            func = _build(kind, hq, hkv, d, paged, page_size, block_n, scale)
            kern = tilelang.compile(
                func,
                target="c",
                compile_flags=_cpu_compile_flags(),
                pass_configs={PassConfigKey.TL_DISABLE_SAFE_MEMORY_ACCESS: True},
            )
            _CACHE[key] = kern
    return kern


def _as_storage(x: torch.Tensor, kind: str) -> torch.Tensor:
    x = x.contiguous()
    if kind == "f32":
        return x
    return x.view(torch.uint16) if hasattr(torch, "uint16") else x.view(torch.int16)


def _plan(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, config):
    if q.dtype not in _KIND_OF:
        raise ValueError(f"unsupported dtype {q.dtype} (expected float16, bfloat16 or float32)")
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError("q, k_cache and v_cache must share one dtype")
    B, _, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    kind = _KIND_OF[q.dtype]
    paged = block_table is not None
    page = int(k_cache.shape[1]) if paged else 0
    cfg = dict(config or {})
    block_n = int(cfg.get("cpu_block_N", 32))
    if paged and page % block_n and block_n % page:
        block_n = 32
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(D)
    return B, Hq, Hkv, D, kind, paged, page, block_n, scale


def prepare(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None, config=None):
    B, Hq, Hkv, D, kind, paged, page, block_n, scale = _plan(
        q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, config
    )
    get_kernel(kind, Hq, Hkv, D, paged, page, block_n, scale)


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None, config=None):
    B, Hq, Hkv, D, kind, paged, page, block_n, scale = _plan(
        q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, config
    )
    kern = get_kernel(kind, Hq, Hkv, D, paged, page, block_n, scale)
    qs = _as_storage(q.reshape(B, Hq, D), kind)
    ks = _as_storage(k_cache, kind)
    vs = _as_storage(v_cache, kind)
    lens = cache_seqlens.to(torch.int32).contiguous()
    if paged:
        bt = block_table.to(torch.int32).contiguous()
    else:
        bt = torch.zeros((B, 1), dtype=torch.int32)
    out = torch.empty((B, Hq, D), dtype=torch.float32)
    kern(qs, ks, vs, lens, bt, out)
    return out.to(q.dtype).view(B, 1, Hq, D)
