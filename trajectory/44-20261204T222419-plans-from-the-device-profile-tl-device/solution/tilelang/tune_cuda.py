"""Sweep block_N x num_splits of the TileLang decode kernel on the 14 benchmark shapes (CUDA GPU).

    python solution/tilelang/tune_cuda.py [--cases 0,1] [--iters 15] [--block-n 64,128]

Prints, per case, the time of the heuristic default, of every (block_N, num_splits) tried and the
best, plus the host-side cost of one run() call (no GPU sync) next to flash_attn's.
Timing as in gpu_selfcheck.py: 256 MiB L2 flush before each call, CUDA events, median.
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_selfcheck as sc  # noqa: E402


def host_cost(fn, n=300):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="")
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--block-n", default="64,128")
    ap.add_argument("--splits", default="1,2,3,4,6,8,12,16,24,32,48,64,96,128")
    args = ap.parse_args()
    rk = sc.load_candidate()
    try:
        from flash_attn import flash_attn_with_kvcache
    except Exception:
        flash_attn_with_kvcache = None
    timer = sc.Timer(args.iters)
    dev = torch.device("cuda")
    idxs = [int(x) for x in args.cases.split(",") if x] or list(range(len(sc.CASES)))
    bns = [int(x) for x in args.block_n.split(",")]
    splits = [int(x) for x in args.splits.split(",")]
    for ci in idxs:
        B, S, Hkv, G = sc.CASES[ci]
        D, Hq = 128, Hkv * G
        torch.manual_seed(ci)
        q = torch.randn((B, 1, Hq, D), dtype=torch.float16, device=dev)
        k = torch.randn((B, S, Hkv, D), dtype=torch.float16, device=dev)
        v = torch.randn((B, S, Hkv, D), dtype=torch.float16, device=dev)
        lens = torch.full((B,), S, dtype=torch.int32, device=dev)
        ref = sc.reference(q, k, v, lens, D ** -0.5)
        t_def = timer(lambda: rk.run(q, k, v, lens))
        ns_def = rk.plan_info(q, k, v, lens)["num_splits"]
        h_def = host_cost(lambda: rk.run(q, k, v, lens))
        t_fa = h_fa = float("nan")
        if flash_attn_with_kvcache is not None:
            fa = lambda: flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, num_splits=0)  # noqa: E731
            t_fa = timer(fa)
            h_fa = host_cost(fa)
        res = []
        for bn in bns:
            n_tiles = -(-S // bn)
            for ns in splits:
                if ns > n_tiles:
                    continue
                cfg = {"block_N": bn, "num_splits": ns}
                try:
                    o = rk.run(q, k, v, lens, config=cfg)
                    err = (o.float() - ref).abs().max().item()
                    t = timer(lambda: rk.run(q, k, v, lens, config=cfg))
                    res.append((t, bn, ns, err))
                except Exception as e:
                    print(f"  case {ci} bn={bn} ns={ns} failed: {type(e).__name__}: {str(e)[:200]}")
        res.sort()
        line = " ".join(f"{bn}/{ns}:{t * 1000:.1f}" for t, bn, ns, _ in sorted(res, key=lambda r: (r[1], r[2])))
        best = res[0] if res else None
        print(f"case {ci:2d} {(B, S, Hkv, G)} default ns={ns_def} t={t_def * 1000:.1f}us  fa={t_fa * 1000:.1f}us  "
              f"best bn={best[1]} ns={best[2]} t={best[0] * 1000:.1f}us  host run={h_def:.1f}us fa={h_fa:.1f}us "
              f"maxerr={max(r[3] for r in res):.1e}", flush=True)
        print(f"   all(us): {line}", flush=True)
        del q, k, v
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
