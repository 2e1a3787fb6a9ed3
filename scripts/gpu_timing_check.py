"""Check kopt.timing on a CUDA GPU: CUPTI spans vs CUDA events, 2-kernel spans, graphs, ABBA pairs.

Run from the workspace root:  PYTHONPATH=src python3 scripts/gpu_timing_check.py [--device cuda:0]
Prints one line per check and a PASS/FAIL summary; exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time


def main() -> int:
    """Run the checks; 0 when all pass."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="smoke-test stopping rule (fewer samples)")
    args = ap.parse_args()
    from kopt import hardware

    if args.device == "cuda":  # one line, exit 2, on a host without a GPU
        hardware.exit_unless_cuda(f"{os.path.basename(__file__)} --device cuda")

    import torch

    from kopt import timing
    from kopt.timing import TimingOptions
    from kopt.timing import cuda as timing_cuda

    dev = args.device
    info = hardware.detect(dev)
    print(f"device {info.name} ({info.raw_name}) units={info.units} L2={info.l2_bytes} warp={info.warp_size} "
          f"flush={hardware.flush_bytes(info)} torch={torch.__version__}")
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        print(f"copy ceiling {hardware.copy_ceiling_gbps(dev, d):.0f} GB/s "
              f"(spec {info.spec_bw_gbps}, {time.perf_counter() - t0:.1f} s)")

    fails: list[str] = []

    def check(name: str, ok: bool, detail: str) -> None:
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}")
        if not ok:
            fails.append(name)

    def show(label: str, st) -> None:
        print(f"  {label:<28} {st.method:<6} median={st.median_ms * 1e3:8.2f}us "
              f"events={(st.events_median_ms or 0) * 1e3:8.2f}us n={st.n:5d} riqr={st.rel_iqr:.3f} "
              f"ci={st.ci_rel:.4f} clock={st.mean_clock_mhz} dropped={st.dropped_low_clock} "
              f"noisy={st.noisy} wall={st.total_s:.2f}s")

    opts = TimingOptions.for_device(dev, quick=args.quick)
    x = torch.zeros(1, device=dev)
    empty = lambda: x.add_(1)  # noqa: E731
    empty()
    t0 = time.perf_counter()
    st = timing.time_fn(empty, dev, opts)
    print(f"  (first time_fn incl. CUPTI start-up: {time.perf_counter() - t0:.2f} s)")
    show("empty kernel, cold", st)
    check("empty kernel measured by cupti", st.method == "cupti", st.method)
    check("events >= cupti", (st.events_median_ms or 0) >= st.median_ms,
          f"{(st.events_median_ms or 0) * 1e3:.2f} vs {st.median_ms * 1e3:.2f} us")

    hot = TimingOptions.for_device(dev, quick=args.quick)
    hot.cold = False
    show("empty kernel, hot (no graph)", timing.time_fn(empty, dev, hot))
    hot.graph = True
    sg = timing.time_fn(empty, dev, hot)
    show("empty kernel, hot graph", sg)
    check("graph per-call time below cold span + 5us", sg.median_ms < st.median_ms + 0.005,
          f"{sg.median_ms * 1e3:.2f} us")

    a = torch.randn(16 << 20, device=dev)        # 64 MiB each: ~30 us a pass, beyond L2
    b = torch.randn(16 << 20, device=dev)
    one = lambda: a.mul_(1.0001)  # noqa: E731
    two = lambda: (a.mul_(1.0001), b.mul_(1.0001))  # noqa: E731
    one(), two()
    s1, s2 = timing.time_fn(one, dev, opts), timing.time_fn(two, dev, opts)
    show("1 kernel (64 MiB rw)", s1)
    show("2 kernels (2 x 64 MiB rw)", s2)
    check("2-kernel span covers both", 1.8 <= s2.median_ms / s1.median_ms <= 2.3,
          f"ratio {s2.median_ms / s1.median_ms:.3f}")
    gbps = 2 * a.numel() * 4 / (s1.median_ms / 1e3) / 1e9
    print(f"  1 kernel moves {gbps:.0f} GB/s cold")

    # Attribution vs kineto's own device-side range (gpu_user_annotation), batch of 20 calls.
    t = timing_cuda.CudaTimer(dev, opts)
    spans, ev, mhz = t._batch(two, 20, cupti=True)
    print(f"  batch spans(us) {[round(s * 1e3, 1) for s in spans[:5]]} events(us) "
          f"{[round(e * 1e3, 1) for e in ev[:5]]} clock {mhz}")
    check("every call attributed", all(s is not None for s in spans), f"{sum(s is None for s in spans)} missing")

    aa = timing.time_pair(one, one, dev, opts)
    print(f"  A/A ratios {[round(r, 4) for r in aa.ratios]} speedup {aa.speedup:.4f} ci {aa.ci}")
    check("A/A speedup within 2% of 1", abs(aa.speedup - 1) < 0.02, f"{aa.speedup:.4f}")
    ab = timing.time_pair(two, one, dev, opts)
    print(f"  2k vs 1k ratios {[round(r, 4) for r in ab.ratios]} speedup {ab.speedup:.4f} ci {ab.ci}")
    check("2-kernel candidate vs 1-kernel baseline ~0.5x", 0.43 <= ab.speedup <= 0.56, f"{ab.speedup:.4f}")

    _flash_attn(dev, opts, show, check)
    print(f"\n{'ALL PASS' if not fails else 'FAILED: ' + ', '.join(fails)}")
    return 1 if fails else 0


def _flash_attn(dev, opts, show, check) -> None:
    """A real decode call (split-KV kernel + combine when flash-attn splits): kernels per call, timing."""
    try:
        from flash_attn import flash_attn_with_kvcache
    except ImportError:
        print("  flash-attn not importable: decode check skipped")
        return
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from kopt import timing
    from kopt.timing import cupti

    B, S, Hkv, Hq, D = 1, 32768, 8, 64, 128
    q = torch.randn(B, 1, Hq, D, device=dev, dtype=torch.float16)
    k = torch.randn(B, S, Hkv, D, device=dev, dtype=torch.float16)
    v = torch.randn_like(k)
    lens = torch.full((B,), S, dtype=torch.int32, device=dev)
    fn = lambda: flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, num_splits=0)  # noqa: E731
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(3):
            with record_function(timing.CALL_RANGE):
                fn()
        torch.cuda.synchronize()
    ranges, recs = cupti.kineto_records(p.profiler.kineto_results.events())
    att = cupti.attribute_calls(ranges, recs)
    names = [r[0][:60] for r in att if r[3] == 0]
    print(f"  flash-attn decode B{B} S{S} Hkv{Hkv} Hq{Hq} D{D}: {len(names)} device records/call: {names}")
    st = timing.time_fn(fn, dev, opts)
    show("flash-attn decode, cold", st)
    gbps = 2 * k.numel() * 2 / (st.median_ms / 1e3) / 1e9
    print(f"  KV bytes / time: {gbps:.0f} GB/s")
    check("flash-attn span >= its kernels", st.median_ms > 0 and len(names) >= 1, f"{len(names)} records")


if __name__ == "__main__":
    sys.exit(main())
