"""Where the harness's own time goes on a CUDA GPU: CUPTI start-up and the host cost of one timed sample.

Run from the workspace root:  PYTHONPATH=src python3 scripts/gpu_timing_overhead.py [--samples N]
Prints one line per measurement (`name: value`), for the wall-time work of `kopt bench --case N`:
start-up pieces (torch import, CUDA init, the first profiler session in a fresh process, alone and
after a TileLang kernel was loaded) and the host microseconds per timed sample of each way of
sampling (profiler context with CPU+CUDA activities, the same without CUDA events, the low-level
enable/disable calls, CUDA activities only, events only). Nothing here changes the harness.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

_FRESH = r"""
import time, sys
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
torch.cuda.init(); x = torch.zeros(1, device="cuda"); torch.cuda.synchronize()
t2 = time.perf_counter()
if sys.argv[1] == "after_kernel":
    sys.path.insert(0, "solution/tilelang")
    import run_kernel
    from kopt.cases import load_cases
    from kopt.workload import make_workload
    case = [c for c in load_cases() if c.id == 10][0]
    w = make_workload(case, 1, "cuda")
    run_kernel.run(*w.args()); torch.cuda.synchronize()
t3 = time.perf_counter()
from kopt.timing import TimingOptions
from kopt.timing.cupti import CUPTI_START_S
from kopt.timing.cuda import CudaTimer
CudaTimer("cuda", TimingOptions())
t4 = time.perf_counter()
print(f"import_torch={t1-t0:.3f} cuda_init={t2-t1:.3f} before_probe={t3-t2:.3f} probe={t4-t3:.3f} "
      f"cupti_start={CUPTI_START_S.get('cuda', -1):.3f}")
"""


def fresh(mode: str) -> str:
    """One start-up measurement in a new process (CUPTI's first session is a per-process cost)."""
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _FRESH, mode], capture_output=True, text=True, timeout=300)
    line = (out.stdout.strip().splitlines() or [out.stderr.strip()[-300:]])[-1]
    return f"{line} process_wall={time.perf_counter() - t:.3f}"


def _variants(tc) -> dict:
    """CudaTimer subclasses that each change one thing about a sample."""
    import torch

    from kopt.timing import cupti

    class NoEvents(tc.CudaTimer):
        def _batch(self, fn, n, use_cupti):
            torch_ev = torch.cuda.Event
            try:
                torch.cuda.Event = _NullEvent
                return super()._batch(fn, n, use_cupti)
            finally:
                torch.cuda.Event = torch_ev

    class LowLevel(tc.CudaTimer):
        """kopt's low-level session with no scope filter: every op recorded on the host."""

        def _profiler(self):
            p = cupti._Session()
            p.scopes = set()
            return p

    class AllOps(tc.CudaTimer):
        def _profiler(self):
            return cupti._Profile()

    class CudaOnly(tc.CudaTimer):
        def _profiler(self):
            p = cupti._Profile()
            from torch.profiler import ProfilerActivity, profile

            p.prof = profile(activities=[ProfilerActivity.CUDA])
            return p

    class EventsOnly(tc.CudaTimer):
        def _batch(self, fn, n, use_cupti):
            return super()._batch(fn, n, False)

    return {"all_ops": AllOps, "no_events": NoEvents, "lowlevel": LowLevel, "cuda_only": CudaOnly,
            "events_only": EventsOnly}


class _NullEvent:
    def __init__(self, **kw):
        pass

    def record(self):
        pass

    def elapsed_time(self, other):
        return 0.0


def per_sample(samples: int) -> None:
    """Host µs per timed sample for each sampling variant (flushed, a tiny kernel as the call)."""
    import torch

    from kopt.timing import TimingOptions
    from kopt.timing import cuda as tc
    from kopt.timing.stats import StopRule

    x = torch.zeros(1 << 20, device="cuda")
    fn = lambda: x.add_(1)  # noqa: E731
    opts = TimingOptions()
    t = tc.CudaTimer("cuda", opts)
    rule = StopRule(min_samples=samples, min_time_s=0.0, target_rel_ci=0.0, max_time_s=60.0, max_samples=samples)

    def run(name, timer):
        timer.sample(fn, rule)                      # warm
        for k in tc.PHASE_S:
            tc.PHASE_S[k] = 0.0
        t0 = time.perf_counter()
        s = timer.sample(fn, rule)
        dt = time.perf_counter() - t0
        n = len(s.dev) + len(s.low_dev)
        dev = [d for d in s.dev if d is not None]
        med = sorted(dev)[len(dev) // 2] * 1e3 if dev else float("nan")
        parts = " ".join(f"{k}={v / max(n, 1) * 1e6:.1f}" for k, v in tc.PHASE_S.items())
        print(f"{name}: {dt / max(n, 1) * 1e6:.1f} us/sample n={n} cupti_records={len(dev)} median_span_us={med:.2f} "
              f"per-sample us: {parts}")

    run("current", t)
    for name, cls in _variants(tc).items():
        run(name, cls("cuda", opts))
    for batch in (50, 200):
        run(f"current_batch{batch}", tc.CudaTimer("cuda", TimingOptions(batch=batch)))


def main() -> int:
    """Print the measurements."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1000)
    args = ap.parse_args()
    from kopt import hardware as _hw

    _hw.exit_unless_cuda(os.path.basename(__file__))  # a GPU tool on a host without one: one line, exit 2
    for mode in ("alone", "after_kernel"):
        print(f"fresh_{mode}: {fresh(mode)}", flush=True)
    per_sample(args.samples)
    return 0


if __name__ == "__main__":
    sys.exit(main())
