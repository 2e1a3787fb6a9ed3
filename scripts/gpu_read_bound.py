"""How close each case can come to its limit: the fastest pure read of its bytes, paired with the candidate.

For each case: the bytes a call must move (kopt.workload.bytes_moved), its limit (kopt's roofline:
max(bytes / read ceiling, launch floor)), and the fastest streaming read of exactly those bytes
(kopt.roofline.read_span_ms: Triton reads, one launch, no math, no dependent load, no merge), found with quick
timing and then ABBA-paired with the candidate's own plan by kopt's timer (device-only cold spans, graph
replays, full stopping rule) in one process. Printed per case: read µs, candidate µs, the read's % of limit
(the most a kernel that only moves the bytes reaches) and the candidate's time over the read's with its 95% CI;
then the geomean of the read's % of limit over the perf cases, a measured bound on GEOMEAN_PCT_LIMIT.

Run from the workspace root:  PYTHONPATH=src python3 scripts/gpu_read_bound.py --cases 4-18 [--out FILE.md]
"""

from __future__ import annotations

import argparse
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="4-18", help="case ids: 10,14 or 4-18")
    ap.add_argument("--out", help="also write the table (markdown) here")
    a = ap.parse_args(argv)
    sys.path.insert(0, os.path.join(ROOT, "src"))
    from kopt import hardware as _hw

    _hw.exit_unless_cuda(os.path.basename(__file__))  # a GPU tool on a host without one: one line, exit 2

    from kopt import candidate, hardware, roofline
    from kopt.cases import load_cases, select
    from kopt.cli.common import parse_ids
    from kopt.timing import TimingOptions, rotating, time_pair
    from kopt.workload import bytes_moved, make_workload

    mod = candidate.load(os.path.join(ROOT, "solution", "tilelang", "run_kernel.py"))
    opts = TimingOptions.for_device("cuda")
    roof = roofline.for_device("cuda")
    dev = hardware.detect("cuda")
    head = (f"device={dev.name} commit={os.environ.get('KOPT_COMMIT', 'unknown')} read_gbps={roof.read_gbps:.0f} "
            f"floor_us={roof.floor_ms * 1e3:.2f}")
    print(head, flush=True)
    rows = []
    for case in select(load_cases(), parse_ids(a.cases)):
        nbytes = bytes_moved(case)
        limit = roofline.limit_ms(nbytes, roof)
        _, how, read = roofline.read_span_ms("cuda", nbytes, quick=True)
        ws = [make_workload(case, seed, "cuda") for seed in (0, 1, 2)]
        cand = rotating(lambda w: mod.run(*w.args(), **w.kwargs(None)), ws)
        cand()
        pt = time_pair(cand, read, "cuda", opts)  # its speedup: read / candidate
        r_ms, c_ms = pt.b.median_ms, pt.a.median_ms
        row = dict(case=case.id, kind=case.kind, bytes=nbytes, limit_us=limit * 1e3, read_us=r_ms * 1e3,
                   cand_us=c_ms * 1e3, read_pct=100 * limit / r_ms, cand_pct=100 * limit / c_ms,
                   ratio=1 / pt.speedup, lo=1 / pt.ci[1], hi=1 / pt.ci[0], how=how)
        rows.append(row)
        print(f"case={case.id} bytes={nbytes} limit_us={row['limit_us']:.2f} read_us={row['read_us']:.2f} "
              f"cand_us={row['cand_us']:.2f} read_pct_limit={row['read_pct']:.1f} cand_pct_limit={row['cand_pct']:.1f} "
              f"cand_over_read={row['ratio']:.3f} ci={row['lo']:.3f}-{row['hi']:.3f} read=\"{how}\"", flush=True)
    perf = [r for r in rows if r["kind"] == "perf"]
    lines = [head, "", "| case | MB | limit µs | read µs | candidate µs | read % of limit | candidate % of limit "
             "| candidate / read (95% CI) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['bytes'] / 1e6:.2f} | {r['limit_us']:.2f} | {r['read_us']:.2f} | "
                     f"{r['cand_us']:.2f} | {r['read_pct']:.1f} | {r['cand_pct']:.1f} | "
                     f"{r['ratio']:.3f} ({r['lo']:.3f}-{r['hi']:.3f}) |")
    if perf:
        g = lambda k: math.exp(sum(math.log(r[k]) for r in perf) / len(perf))  # noqa: E731
        tail = (f"geomean over {len(perf)} perf cases: read % of limit {g('read_pct'):.1f}, candidate % of limit "
                f"{g('cand_pct'):.1f}, candidate / read {g('ratio'):.3f}")
        print(tail, flush=True)
        lines += ["", tail]
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
