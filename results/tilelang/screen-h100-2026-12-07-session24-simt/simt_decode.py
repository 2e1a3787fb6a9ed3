"""Prototype: a CUDA-core (SIMT) decode kernel, FlashInfer's decode layout: VEC-wide head-dim slices a thread, key
lanes that each keep their own online softmax, one merge across lanes at the end (no per-tile cross-warp reduction)."""
import math

import tilelang
import tilelang.language as T

LOG2E = 1.4426950408889634


def build_simt(dtype="float16", hq=32, hkv=8, d=128, paged=False, page_size=16, threads=128, U=4, eager=True):
    G = hq // hkv
    VEC = 8
    TD = d // VEC
    KL = threads // TD
    sm_scale = 1.0 / math.sqrt(d) * LOG2E
    accum = "float32"
    batch = T.dynamic("batch")
    max_pages = T.dynamic("max_pages")
    if paged:
        num_blocks = T.dynamic("num_blocks")
        kv_shape = [num_blocks, page_size, hkv, d]
        alloc_len = max_pages * page_size
    else:
        seqlen_k = T.dynamic("seqlen_k")
        kv_shape = [batch, seqlen_k, hkv, d]
        alloc_len = seqlen_k
    NOUT = -(-G * d // threads)  # the timed run floored this (G * d // threads): see README.md

    @T.prim_func
    def decode_simt(
        Q: T.Tensor([batch, hq, d], dtype),
        K: T.Tensor(kv_shape, dtype),
        V: T.Tensor(kv_shape, dtype),
        L: T.Tensor([batch], "int32"),
        BT: T.Tensor([batch, max_pages], "int32"),
        Out: T.Tensor([batch, hq, d], dtype),
    ):
        with T.Kernel(hkv, batch, threads=threads) as (h, b):
            tx = T.get_thread_binding()
            q = T.alloc_local([G * VEC], accum)
            o = T.alloc_local([G * VEC], accum)
            m = T.alloc_local([G], accum)
            lsum = T.alloc_local([G], accum)
            kv = T.alloc_local([U * VEC], dtype)
            vv = T.alloc_local([U * VEC], dtype)
            s = T.alloc_local([U * G], accum)
            mx = T.alloc_local([1], accum)
            mu = T.alloc_local([1], accum)
            r = T.alloc_local([1], accum)
            M_s = T.alloc_shared([KL * G], accum)
            L_s = T.alloc_shared([KL * G], accum)
            O_s = T.alloc_shared([KL * G * d], accum)
            seqlen = L[b]
            dl = tx % TD
            kl = tx // TD
            for g in T.unroll(G):
                for i in T.vectorized(VEC):
                    q[g * VEC + i] = T.cast(Q[b, h * G + g, dl * VEC + i], accum) * sm_scale
            for g in T.unroll(G):
                m[g] = -T.infinity(accum)
                lsum[g] = 0.0
                for i in T.unroll(VEC):
                    o[g * VEC + i] = 0.0
            n_chunks = T.ceildiv(seqlen, KL * U)
            for c in T.serial(T.max(n_chunks, 1) if eager else n_chunks):
                for u in T.unroll(U):
                    key = (c * U + u) * KL + kl
                    if eager:
                        lim = T.if_then_else(c == 0, alloc_len, seqlen)
                    else:
                        lim = seqlen
                    kc = T.max(T.min(key, lim - 1), 0)
                    if paged:
                        r0 = T.max(T.min(BT[b, kc // page_size], num_blocks - 1), 0)
                        r1 = kc % page_size
                    else:
                        r0 = b
                        r1 = kc
                    for i in T.vectorized(VEC):
                        kv[u * VEC + i] = K[r0, r1, h, dl * VEC + i]
                    for i in T.vectorized(VEC):
                        vv[u * VEC + i] = V[r0, r1, h, dl * VEC + i]
                for u in T.unroll(U):
                    for g in T.unroll(G):
                        s[u * G + g] = 0.0
                        for i in T.unroll(VEC):
                            s[u * G + g] += q[g * VEC + i] * T.cast(kv[u * VEC + i], accum)
                for u in T.unroll(U):
                    for g in T.unroll(G):
                        for off in T.unroll(int(math.log2(TD))):
                            s[u * G + g] += T.shfl_xor(s[u * G + g], TD >> (off + 1))
                for u in T.unroll(U):
                    key = (c * U + u) * KL + kl
                    for g in T.unroll(G):
                        s[u * G + g] = T.if_then_else(key < seqlen, s[u * G + g], -T.infinity(accum))
                for g in T.unroll(G):
                    mx[0] = m[g]
                    for u in T.unroll(U):
                        mx[0] = T.max(mx[0], s[u * G + g])
                    mu[0] = T.if_then_else(mx[0] == -T.infinity(accum), 0.0, mx[0])
                    r[0] = T.exp2(m[g] - mu[0])
                    m[g] = mx[0]
                    lsum[g] = lsum[g] * r[0]
                    for i in T.unroll(VEC):
                        o[g * VEC + i] = o[g * VEC + i] * r[0]
                    for u in T.unroll(U):
                        s[u * G + g] = T.exp2(s[u * G + g] - mu[0])
                        lsum[g] = lsum[g] + s[u * G + g]
                        for i in T.unroll(VEC):
                            o[g * VEC + i] += s[u * G + g] * T.cast(vv[u * VEC + i], accum)
            # one merge across the key lanes
            for g in T.unroll(G):
                if dl == 0:
                    M_s[kl * G + g] = m[g]
                    L_s[kl * G + g] = lsum[g]
                for i in T.unroll(VEC):
                    O_s[(kl * G + g) * d + dl * VEC + i] = o[g * VEC + i]
            T.sync_threads()
            for t in T.unroll(NOUT):
                idx = t * threads + tx
                g = idx // d
                j = idx % d
                if idx < G * d:
                    mx[0] = -T.infinity(accum)
                    for k in T.unroll(KL):
                        mx[0] = T.max(mx[0], M_s[k * G + g])
                    mu[0] = T.if_then_else(mx[0] == -T.infinity(accum), 0.0, mx[0])
                    r[0] = 0.0
                    lsum[0] = 0.0
                    for k in T.unroll(KL):
                        r[0] += T.exp2(M_s[k * G + g] - mu[0]) * O_s[(k * G + g) * d + j]
                        lsum[0] += T.exp2(M_s[k * G + g] - mu[0]) * L_s[k * G + g]
                    Out[b, h * G + g, j] = T.cast(T.if_then_else(lsum[0] > 0, r[0] / lsum[0], 0.0), dtype)

    return decode_simt


def compile_simt(target="sm_90a", **kw):
    from tilelang.transform import PassConfigKey
    from tvm.target import Target
    cfg = {PassConfigKey.TL_DISABLE_SAFE_MEMORY_ACCESS: True, PassConfigKey.TL_ENABLE_FAST_MATH: True}
    return tilelang.compile(build_simt(**kw), target=Target({"kind": "cuda", "arch": target}), pass_configs=cfg)


if __name__ == "__main__":  # print the lowered CUDA of one shape (no GPU needed)
    import sys
    from tilelang.transform import PassConfigKey
    from tvm.target import Target
    func = build_simt(paged=len(sys.argv) > 1)
    with tilelang.transform.PassContext(config={PassConfigKey.TL_DISABLE_SAFE_MEMORY_ACCESS: True}):
        mod = tilelang.lower(func, target=Target({"kind": "cuda", "arch": "sm_90a"}))
    src = mod.kernel_source if hasattr(mod, "kernel_source") else str(mod)
    print(src)
