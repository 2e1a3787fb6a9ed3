"""What a cold L2 costs a call in instruction fetch: each case timed after the flush alone, and after the flush
followed by the same kernels on a throw-away input (every length 1, separate buffers), which brings the kernels'
code back into L2 (and the SMs' instruction caches) while their data stays cold.

The call's output is checked against the fp32 reference first. Both ways are CUDA graphs of [flush, (warm-up
call,) mark, call] x N replayed under CUPTI (gpu_graph_check's method: a call is the run of its own kernels
after the mark). The difference is the time the call spends fetching its instructions from DRAM; ABBA over
`--rounds` so that drift cancels. A warm-up call shares the plan's workspaces (split partials, counters), so
on plans that write them it can slow the call after it: read the difference only where it is not negative.

Run from the workspace root:  PYTHONPATH=src python3 scripts/gpu_code_warm.py --cases 4,5,10 [--config JSON]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))


def spans(fn, flush, warm, n: int, replays: int) -> list[float]:
    """µs per call of fn, from replays of one graph of [flush, warm?, mark, fn] x n."""
    import gpu_graph_check as gc

    def body():
        flush()
        if warm is not None:
            warm()
        gc.mark()
        fn()

    runs, _ = gc.replayed_runs(body, n, replays, gc.kernel_names(fn))
    per = 2 if warm is not None else 1  # with a warm-up call its run comes first, then the call's
    if len(runs) != n * replays * per:
        raise RuntimeError(f"{len(runs)} runs for {n * replays} calls")
    return runs[per - 1::per]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="4,5,10")
    ap.add_argument("--config", default=None, help="a JSON config for run(config=...)")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2, help="ABBA rounds")
    args = ap.parse_args()
    try:
        cfg = json.loads(args.config) if args.config else None
        if cfg is not None and not isinstance(cfg, dict):
            raise ValueError("want a JSON object")
    except ValueError as e:
        print(f"error: --config {args.config!r}: {e}", file=sys.stderr)
        return 2
    from kopt import hardware as _hw

    _hw.exit_unless_cuda(os.path.basename(__file__))
    import torch

    import gpu_graph_check as gc
    from kopt import baselines, candidate, cases
    from kopt.cli.common import parse_ids
    from kopt.eval import checks
    from kopt.paths import default_candidate
    from kopt.reference import reference
    from kopt.workload import make_workload

    mod = candidate.load(default_candidate(REPO))
    flush = gc.read_flush()
    print(f"device={torch.cuda.get_device_name()} commit={os.environ.get('KOPT_COMMIT', 'NA')} config={args.config}")
    for c in cases.select(cases.load_cases(), parse_ids(args.cases)):
        w = make_workload(c, seed=0, device="cuda")
        a, kw = list(w.args()), dict(w.kwargs())
        # the same shapes (so the same compiled kernels), separate buffers, every length 1
        tiny = [a[0].clone(), torch.zeros_like(a[1]), torch.zeros_like(a[2]), torch.ones_like(a[3])]
        fn = lambda a=a, kw=kw: mod.run(*a, **kw, config=cfg)  # noqa: E731
        warm = lambda t=tiny, kw=kw: mod.run(*t, **kw, config=cfg)  # noqa: E731
        warm()
        chk = checks.check_output(fn(), reference(w), baselines.torch_attention(w), w.q)
        if chk.status.value != "ok":  # a wrong call's time says nothing
            print(f"case={c.id} INCORRECT {chk.detail}", flush=True)
            continue
        cold, hot = [], []
        for _ in range(args.rounds):
            cold += spans(fn, flush, None, args.calls, args.replays)
            hot += spans(fn, flush, warm, args.calls, args.replays)
            hot += spans(fn, flush, warm, args.calls, args.replays)
            cold += spans(fn, flush, None, args.calls, args.replays)
        mc, mh = statistics.median(cold), statistics.median(hot)
        print(f"case={c.id} cold_code_us={mc:.2f} warm_code_us={mh:.2f} code_fetch_us={mc - mh:.2f} "
              f"share={100 * (mc - mh) / mc:.1f}%", flush=True)
        del w, a, tiny
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(rc)  # skip the interpreter's teardown of CUDA graphs, profiler and allocator (it can abort)
