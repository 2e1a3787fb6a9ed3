"""What the cold-cache flush itself costs the timed call: the same calls after four kinds of flush.

Run from the workspace root on a CUDA host:  PYTHONPATH=src python3 scripts/gpu_flush_study.py [--cases 8,10,13]
For each case, three functions (the shipped candidate, FA2 `flash_attn_with_kvcache`, and a neutral
probe that only reads K and V: `k.sum()` + `v.sum()`) are timed with CUDA events after each flush,
the flush kinds interleaved call by call:

  zero        max(2 x L2, 256 MiB) zeroed (nvbench's and Triton's way; kopt's `--flush zero`)
  zero+evict  the same, then the buffer's first 1.5 x L2 bytes read: the dirty lines the zeroing left
              in L2 are written back before the call, not during it
  evict       the whole buffer read, never written (L2 left clean; kopt's default `--flush read`
              reads it the same way, measured separately as read_harness)
  none        no flush (hot L2 for small cases)

The events are recorded behind the queued flush, so they time the call (plus ~1-2 µs of event
overhead, the same in every column). Prints one line per (case, function): median µs per flush kind,
and each kind's own cost. Nothing here changes the harness.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="8,10,13,14,12")
    ap.add_argument("--samples", type=int, default=150)
    ap.add_argument("--candidate", default="solution/tilelang/run_kernel.py")
    a = ap.parse_args()
    from kopt import hardware

    hardware.exit_unless_cuda(os.path.basename(__file__))  # a GPU tool on a host without one: one line, exit 2

    import torch

    from kopt import baselines, candidate
    from kopt.cases import load_cases
    from kopt.workload import bytes_moved, make_workload

    info = hardware.detect("cuda")
    l2 = info.l2_bytes or 50 * 2**20
    nbytes = hardware.flush_bytes(info)
    buf = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    head = buf[: (int(1.5 * l2) // 4) * 4].view(torch.float32)
    whole = buf.view(torch.float32)
    buf.zero_()
    flushes = {
        "zero": lambda: buf.zero_(),
        "zero+evict": lambda: (buf.zero_(), head.sum()),
        "evict": lambda: whole.sum(),
        "none": lambda: None,
    }
    print(f"device={info.name} l2_bytes={l2} flush_bytes={nbytes} torch={torch.__version__}", flush=True)
    mod = candidate.load(Path(a.candidate))
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(4)]

    # each flush kind's own device time, and other ways to read the buffer (the harness's read flush
    # is torch.sum over a float32 view into a preallocated sink)
    from kopt.timing.cuda import make_flush

    other = {
        "read_harness": make_flush(buf, "read"),
        "read_i64_sum": lambda: buf.view(torch.int64).sum(),
        "read_amax": lambda: whole.amax(),
        "read_f16_max": lambda: buf.view(torch.float16).max(),
        "read_any": lambda: buf.any(),
    }
    cost = {}
    for name, f in {**flushes, **other}.items():
        xs = []
        for _ in range(30):
            ev[0][0].record()
            f()
            ev[0][1].record()
            torch.cuda.synchronize()
            xs.append(ev[0][0].elapsed_time(ev[0][1]) * 1e3)
        cost[name] = statistics.median(xs[5:])
    print("flush_cost_us " + " ".join(f"{k}={v:.1f}" for k, v in cost.items()), flush=True)

    cases = {c.id: c for c in load_cases()}
    for cid in [int(x) for x in a.cases.split(",")]:
        case = cases[cid]
        ws = [make_workload(case, s, "cuda") for s in (1, 2)]
        fns = {
            "candidate": lambda w: mod.run(*w.args(), **w.kwargs()),
            "fa2": baselines.flash_attn_kvcache,
            "read_kv": lambda w: (w.k_cache.sum(), w.v_cache.sum()),
        }
        for fname, fn in fns.items():
            for w in ws:
                fn(w)
            torch.cuda.synchronize()
            res = {k: [] for k in flushes}
            for i in range(a.samples):
                w = ws[i % 2]
                for j, (_k, f) in enumerate(flushes.items()):
                    f()
                    ev[j][0].record()
                    fn(w)
                    ev[j][1].record()
                torch.cuda.synchronize()
                for j, k in enumerate(flushes):
                    res[k].append(ev[j][0].elapsed_time(ev[j][1]) * 1e3)
            med = {k: statistics.median(v) for k, v in res.items()}
            mb = bytes_moved(case) / 1e6
            print(f"case={cid} fn={fname} MB={mb:.1f} " + " ".join(f"{k}={v:.2f}" for k, v in med.items())
                  + f" zero_minus_evict={med['zero'] - med['zero+evict']:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
