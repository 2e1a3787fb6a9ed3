"""fp32 reference attention, computed independently of any baseline (plain torch math, per sequence)."""

from __future__ import annotations

from kopt.workload import Workload


def reference(w: Workload):
    """Exact-in-fp32 decode attention over each sequence's valid keys; returns [B, 1, Hq, D] float32."""
    import torch

    k_all, v_all = w.logical_kv()
    b, _, hq, d = w.q.shape
    hkv = k_all.shape[2]
    g = hq // hkv
    out = torch.empty((b, 1, hq, d), dtype=torch.float32, device=w.q.device)
    lens = w.cache_seqlens.tolist()
    for i in range(b):
        n = int(lens[i])
        q = w.q[i, 0].float().reshape(hkv, g, d)                 # [Hkv, G, D]
        k = k_all[i, :n].float().permute(1, 2, 0)                # [Hkv, D, n]
        v = v_all[i, :n].float().permute(1, 0, 2)                # [Hkv, n, D]
        s = torch.bmm(q, k) * w.softmax_scale                    # [Hkv, G, n]
        p = torch.softmax(s, dim=-1)
        out[i, 0] = torch.bmm(p, v).reshape(hq, d)
    return out
