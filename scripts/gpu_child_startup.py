"""Where the evaluation child's start-up goes (the `child_warm` phase of kopt's wall time), on a GPU host.

    python3 scripts/gpu_child_startup.py [--runs 3]

Each run is a fresh interpreter that does what kopt.eval.worker's warm-up does, one step at a time, and prints
each step's seconds: the interpreter's start, import torch, torch.profiler, kopt's harness modules, the library
versions, the CUDA context, import tilelang. Then the same with the CUDA context created first by the driver API
in a thread (ctypes: the GIL is released while the driver works), which is what the child does now: the
context's creation overlaps the imports. One line per run and mode.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_STEPS = r"""
import json, sys, time
t0 = float(sys.argv[1]); out = {"interpreter": time.time() - t0}
overlap = sys.argv[2] == "overlap"
t = time.perf_counter()
if overlap:
    from kopt.eval.worker import start_context
    ctx = start_context()
    out["context_thread_start"] = time.perf_counter() - t; t = time.perf_counter()
import torch
out["import_torch"] = time.perf_counter() - t; t = time.perf_counter()
import torch.profiler
out["torch_profiler"] = time.perf_counter() - t; t = time.perf_counter()
from kopt import baselines, candidate, hardware, timing, workload
out["kopt_modules"] = time.perf_counter() - t; t = time.perf_counter()
from kopt.eval.worker import versions
versions()
out["versions"] = time.perf_counter() - t; t = time.perf_counter()
if overlap:
    ctx.join()
    out["context_join"] = time.perf_counter() - t; t = time.perf_counter()
torch.cuda.mem_get_info()
out["cuda_context"] = time.perf_counter() - t; t = time.perf_counter()
import tilelang
out["import_tilelang"] = time.perf_counter() - t
out["total"] = time.time() - t0
print(json.dumps(out))
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args(argv)
    from kopt import hardware as _hw

    _hw.exit_unless_cuda(os.path.basename(__file__))  # a GPU tool on a host without one: one line, exit 2
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for i in range(a.runs):
        for mode in ("serial", "overlap"):
            t0 = time.time()
            p = subprocess.run([sys.executable, "-c", _STEPS, repr(t0), mode], env=env, capture_output=True, text=True)
            if p.returncode:
                print(f"run={i} mode={mode} FAILED {p.stderr.strip().splitlines()[-1:]}", flush=True)
                continue
            d = json.loads(p.stdout.strip().splitlines()[-1])
            print(f"run={i} mode={mode} " + " ".join(f"{k}={v:.3f}" for k, v in d.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
