"""Run from the workspace root on a GPU host: python3 results/tilelang/screen-h100-2026-12-07-session24-simt/simt_screen.py

Device screen: the SIMT decode prototype against the shipped candidate, paired (kopt.timing.time_pair), on every
direct plan (G <= 8) of the named cases and held-out seeds 20261206-08."""
import sys, time, json, concurrent.futures as cf
import os
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
import simt_decode as simt
sys.path.insert(0, 'solution/tilelang')
from tl_decode_cuda import fast_call
from kopt import baselines, candidate, workloads as W
from kopt.cases import load_cases
from kopt.eval import check_output
from kopt.lab.common import workloads
from kopt.reference import reference
from kopt.timing import TimingOptions, rotating, time_pair

VARIANTS = [dict(threads=128, U=4), dict(threads=128, U=8), dict(threads=256, U=4)]
mod = candidate.load("solution/tilelang/run_kernel.py")
wf = W.load()
cases = [(0, c) for c in load_cases()]
for seed in (20261206, 20261207, 20261208):
    cases += [(seed, c) for c in W.draw(wf, 12, seed)]
todo = []
for seed, c in cases:
    ws = workloads(c)
    info = mod.plan_info(*ws[0].args(), **ws[0].kwargs(None))
    q, k = ws[0].q, ws[0].k_cache
    hq, hkv, d = q.shape[-2], k.shape[-2], q.shape[-1]
    if info["kernel"] != "decode_direct" or hq // hkv > 8:
        continue
    import math
    assert ws[0].softmax_scale is None or abs(ws[0].softmax_scale - 1/math.sqrt(d)) < 1e-6, ws[0].softmax_scale
    todo.append((seed, c, ws, info))
print(f"{len(todo)} direct plans", flush=True)

def key(ws, v):
    q, k = ws[0].q, ws[0].k_cache
    paged = ws[0].block_table is not None
    return dict(dtype="float16" if q.dtype == torch.float16 else "bfloat16", hq=q.shape[-2], hkv=k.shape[-2],
                d=q.shape[-1], paged=paged, page_size=k.shape[1] if paged else 16, **v)
keys = {json.dumps(key(ws, v), sort_keys=True) for _, _, ws, _ in todo for v in VARIANTS}
t0 = time.time()
with cf.ThreadPoolExecutor(14) as ex:
    futs = {kk: ex.submit(simt.compile_simt, **json.loads(kk)) for kk in keys}
    kernels = {}
    for kk, f in futs.items():
        try:
            kernels[kk] = f.result()
        except Exception as e:
            print("COMPILE FAIL", kk, type(e).__name__, str(e)[:300], flush=True)
print(f"compiled {len(kernels)} in {time.time()-t0:.0f} s", flush=True)
opts = TimingOptions.for_device("cuda", quick=True)
for seed, c, ws, info in todo:
    base = rotating(lambda w: mod.run(*w.args(), **w.kwargs(None)), ws)
    base()
    for v in VARIANTS:
        kk = json.dumps(key(ws, v), sort_keys=True)
        if kk not in kernels:
            continue
        kern = kernels[kk]
        fk = fast_call(kern)
        dummies = {id(w): torch.zeros((w.q.shape[0], 1), dtype=torch.int32, device="cuda") for w in ws}
        def call(w, fk=fk, dummies=dummies):
            q3 = w.q.view(w.q.shape[0], -1, w.q.shape[-1])
            out = torch.empty_like(q3)
            bt = w.block_table if w.block_table is not None else dummies[id(w)]
            fk(q3, w.k_cache, w.v_cache, w.cache_seqlens, bt, out)
            return out.view_as(w.q)
        try:
            out = call(ws[0]); torch.cuda.synchronize()
            chk = check_output(out, reference(ws[0]), baselines.torch_attention(ws[0]), ws[0].q)
            ok = chk.status.value
            if ok != "ok":
                print(f"seed={seed} case={c.id} {v} INCORRECT {chk.detail}", flush=True); continue
            pt = time_pair(rotating(call, ws), base, "cuda", opts)
            print(f"seed={seed} case={c.id} T{v['threads']}U{v['U']} speedup={pt.speedup:.4f} "
                  f"simt_us={pt.a.median_ms*1e3:.2f} base_us={pt.b.median_ms*1e3:.2f} ci={pt.ci[0]:.3f}-{pt.ci[1]:.3f} plan=bn{info['block_N']} eager{int(info['eager'])} vs{info['v_split']}", flush=True)
        except Exception as e:
            print(f"seed={seed} case={c.id} {v} FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
