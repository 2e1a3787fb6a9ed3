"""Where a call's time goes between its kernels: each kernel's start and end inside the call, cold, on the device.

For each case, the candidate's call is run cold (kopt's read flush before every call) and launched on the stream
behind a spin kernel (a new one every CHUNK calls), so the host is far ahead and no kernel waits for its launch;
kopt's own profiler session (CUPTI through kineto) records every kernel. Per call, its kernels in start order: start
and end relative to the call's first start. Printed per case and kernel (medians over the calls): start, end,
duration; then the span. Beside it, each of --configs in place (laid over the plan with '+{..}', as
gpu_config_screen.py does): by default the plan with its combine launched plainly (pdl 0). Time a merge or launch
change this way, not as a standalone kernel: a combine that ran faster alone did not in place (iteration 43).

For a plan with a combine kernel, what the merge adds to the call is `handoff_us`: the combine's end past the split
kernel's end. Beside it, the floor of that design (--floor): the same bytes read in the plan's shape by a Triton
kernel (no math) that writes the plan's partial rows (Opart, LSE) as the split kernel does, followed by the plan's own
combine kernel (without the programmatic dependent launch: Triton does not trigger one): how early a split + combine
call could end if the split kernel did nothing but read. After the same read, the floor of any merge kernel: a
kernel that only stores a word (what a second kernel costs by itself), and Triton combines of 32, 64 and 128 columns a
program (every split's LSE and partial O loaded at once; each first checked against the plan's combine).

These spans are stream launches (not graph replays): read them against each other, not against RUNTIME.

Run from the workspace root:  PYTHONPATH=src python3 scripts/gpu_kernel_timeline.py --cases 10,14 [--floor] [--out F]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CALLS = 400      # calls timed per case (one profiler session)
HOLD_US = 4000   # the spin kernel ahead of each chunk of them (~2 GHz: 2000 cycles a µs)
CHUNK = 20       # calls launched behind one hold (a call's launches cost the host up to ~100 µs)
DEFAULT_CONFIGS = 'pdl0=+{"pdl": 0}'  # the same plan with its combine launched plainly: what the dependent launch buys


@functools.cache
def _partials_kernel():
    """The plan-shaped read that writes partial rows: program (split, kv head, batch row) sums its range's K and V
    tiles of [BLOCK_N, D] rows and stores the column sums as each of its G query heads' partial row, and 0 as their
    LSE (every split weighs the same in the combine)."""
    import triton
    import triton.language as tl

    @triton.jit
    def _partials(k, v, opart, lse, S, sb, ss, sh, NS, TILES, G: tl.constexpr, BLOCK_N: tl.constexpr,
                  D: tl.constexpr):
        sid, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        hq = tl.num_programs(1) * G
        acc = tl.zeros([BLOCK_N, D], dtype=tl.float32)
        cols = tl.arange(0, D)
        for t in range(TILES):
            rows = (sid * TILES + t) * BLOCK_N + tl.arange(0, BLOCK_N)
            off = b.to(tl.int64) * sb + rows[:, None].to(tl.int64) * ss + h.to(tl.int64) * sh + cols[None, :]
            m = rows[:, None] < S
            acc += tl.load(k + off, mask=m, other=0.0).to(tl.float32)
            acc += tl.load(v + off, mask=m, other=0.0).to(tl.float32)
        col = tl.sum(acc, axis=0)
        for g in tl.static_range(G):
            row = (b * hq + h * G + g) * NS + sid
            tl.store(opart + row.to(tl.int64) * D + cols, col)
            tl.store(lse + row, 0.0)

    return _partials


@functools.cache
def _merge_kernels():
    """Second kernels for the floor of a merge kernel: one that only stores a word (what any second kernel costs),
    and a Triton combine of the partials, program (column block, query head, batch row): the LSE and partial-O values
    of all splits loaded at once (one round trip), weights 2^(lse - max) / sum, the weighted sum stored."""
    import triton
    import triton.language as tl

    @triton.jit
    def _empty(flag):
        tl.store(flag + tl.program_id(0), 1.0)

    @triton.jit
    def _combine(opart, lse, out, NS, HQ, D: tl.constexpr, NSP: tl.constexpr, COLS: tl.constexpr):
        cb, hh, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        sp = tl.arange(0, NSP)
        cols = cb * COLS + tl.arange(0, COLS)
        row = (b * HQ + hh).to(tl.int64) * NS
        ls = tl.load(lse + row + sp, mask=sp < NS, other=-float("inf"))
        o = tl.load(opart + (row + sp[:, None]) * D + cols[None, :], mask=sp[:, None] < NS, other=0.0)
        m = tl.max(ls, axis=0)
        w = tl.exp2(ls - m)
        acc = tl.sum(w[:, None] * o, axis=0) / tl.sum(w, axis=0)
        tl.store(out + (b * HQ + hh).to(tl.int64) * D + cols, acc.to(out.dtype.element_ty))

    return _empty, _combine


def timeline(fn, flush, n: int = CALLS) -> tuple[list[list[tuple[str, float, float]]], int]:
    """Per call (launched behind a hold, each after a flush): its kernels as (name, start µs, end µs) from the call's
    first start, in start order; and how many calls had no device record."""
    import torch

    from kopt.timing.cupti import kineto_trace, profiler
    from kopt.timing.options import CALL_RANGE

    rf = torch.profiler.record_function
    fn(), flush()
    torch.cuda.synchronize()
    prof = profiler()
    with prof:
        for i in range(n):
            if i % CHUNK == 0:  # a fresh hold every CHUNK calls: the host stays ahead of the device
                torch.cuda.synchronize()
                torch.cuda._sleep(HOLD_US * 2000)
            flush()
            with rf(CALL_RANGE):
                fn()
        torch.cuda.synchronize()
    tr = kineto_trace(prof.events())
    calls, missing = [], 0
    for recs in tr.by_call(len(tr.ranges)):
        if not recs:
            missing += 1
            continue
        t0 = recs[0].start
        calls.append([(r.name, (r.start - t0) / 1e3, (r.end - t0) / 1e3) for r in recs])
    return calls, missing


def summarize(label: str, calls: list, missing: int) -> tuple[list[str], dict]:
    """Lines of one timeline (medians per kernel position) and its numbers: span, and handoff where two kernels."""
    shapes = {len(c) for c in calls}
    lines = []
    if len(shapes) != 1:
        return [f"| {label} | NA: the calls launched different kernel counts ({sorted(shapes)}) | | | |"], {}
    k = shapes.pop()
    med = statistics.median
    nums = {"span_us": med([max(e for _, _, e in c) for c in calls]), "missing": missing}
    for j in range(k):
        name = calls[0][j][0]
        s, e = med([c[j][1] for c in calls]), med([c[j][2] for c in calls])
        d = med([c[j][2] - c[j][1] for c in calls])
        lines.append(f"| {label} | {j}: `{name[:48]}` | {s:.2f} | {e:.2f} | {d:.2f} |")
    if k == 2:
        nums["handoff_us"] = med([c[1][2] - c[0][2] for c in calls])
    return lines, nums


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="10", help="case ids: 10,14 or 4-14")
    ap.add_argument("--floor", action="store_true", help="also the plan-shaped read + the plan's combine kernel")
    ap.add_argument("--calls", type=int, default=CALLS, help=f"calls a timeline (default {CALLS})")
    ap.add_argument("--configs", default=DEFAULT_CONFIGS,
                    help="';'-separated label=JSON timed beside the candidate's own plan (label=+JSON: laid over its "
                         f"resolved plan, as gpu_config_screen.py does; default {DEFAULT_CONFIGS!r}; '' for none)")
    ap.add_argument("--out", help="also write the table (markdown) here")
    a = ap.parse_args(argv)
    if a.calls < 20:
        print(f"error: --calls must be at least 20, got {a.calls}", file=sys.stderr)
        return 2
    from gpu_config_screen import parse_configs, resolved_config, same_plan  # this script's folder is on sys.path

    try:
        configs = parse_configs(a.configs)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sys.path.insert(0, os.path.join(ROOT, "src"))
    from kopt import hardware

    hardware.exit_unless_cuda(os.path.basename(__file__))  # a GPU tool on a host without one: one line, exit 2

    import torch

    from kopt import candidate, roofline
    from kopt.cases import load_cases, select
    from kopt.cli.common import parse_ids
    from kopt.timing import rotating
    from kopt.timing.cuda import make_flush
    from kopt.workload import bytes_moved, make_workload

    mod = candidate.load(os.path.join(ROOT, "solution", "tilelang", "run_kernel.py"))
    import tl_decode_cuda as tdc  # the candidate's kernel module (its folder is on sys.path once loaded)

    dev = hardware.detect("cuda")
    roof = roofline.for_device("cuda")
    buf = torch.zeros(hardware.flush_bytes(dev), dtype=torch.uint8, device="cuda")
    flush = make_flush(buf, "read")
    head = (f"device={dev.name} commit={os.environ.get('KOPT_COMMIT', 'unknown')} calls={a.calls} "
            "(stream launches behind a hold, cold: read flush before each call; medians)")
    print(head, flush=True)
    lines = [head, "", "| case / call | kernel | start µs | end µs | duration µs |", "|---|---|---|---|---|"]
    tails = []
    for case in select(load_cases(), parse_ids(a.cases)):
        limit_us = roofline.limit_ms(bytes_moved(case), roof) * 1e3
        ws = [make_workload(case, seed, "cuda") for seed in (0, 1, 2)]
        cand = rotating(lambda w: mod.run(*w.args(), **w.kwargs(None)), ws)
        plan = mod.plan_info(*ws[0].args(), **ws[0].kwargs(None))
        got, nums = summarize(f"{case.id} candidate", *timeline(cand, flush, a.calls))
        lines += got
        print("\n".join(got), flush=True)
        nan = float("nan")
        tail = (f"case={case.id} limit_us={limit_us:.2f} plan=block_N {plan['block_N']} x {plan['num_splits']} splits "
                f"span_us={nums.get('span_us', nan):.2f} handoff_us={nums.get('handoff_us', nan):.2f}")
        if nums.get("missing"):
            tail += f" calls_without_records={nums['missing']}"
        # a uniform contiguous split plan whose partials a combine kernel merges: the plans --floor models
        split = plan["num_splits"] > 1
        two = not plan["balanced"] and not plan["paged"] and tdc.combine_follows(split, plan["last_cta"])
        for label, cfg, over in configs:  # each config in place: its plan, launched as the candidate launches it
            full = {**resolved_config(mod, plan), **cfg} if over else cfg
            if same_plan(mod.plan_info(*ws[0].args(), **ws[0].kwargs(full)), plan):
                tail += f" {label}=same_plan(not timed again)"  # e.g. pdl 0 where no combine kernel follows
                continue
            fn = rotating(lambda w, c=full: mod.run(*w.args(), **w.kwargs(c)), ws)
            got, cn = summarize(f"{case.id} candidate, {label}", *timeline(fn, flush, a.calls))
            lines += got
            print("\n".join(got), flush=True)
            tail += f" {label}_span_us={cn.get('span_us', nan):.2f} {label}_handoff_us={cn.get('handoff_us', nan):.2f}"
        if a.floor and two:
            w = ws[0]
            kc, vc = w.k_cache, w.v_cache
            bsz, seq, hkv, d = kc.shape
            hq, ns, bn = w.q.shape[2], plan["num_splits"], plan["block_N"]
            tiles = (-(-seq // bn) + ns - 1) // ns  # a split's tiles of the plan's block_N keys
            opart = torch.empty((bsz, hq, ns, d), dtype=torch.float32, device="cuda")
            lse = torch.empty((bsz, hq, ns), dtype=torch.float32, device="cuda")
            out = torch.empty((bsz, hq, d), dtype=w.q.dtype, device="cuda")
            kern = _partials_kernel()
            dtype = "float16" if w.q.dtype == torch.float16 else "bfloat16"
            comb = tdc.get_combine(dtype, hq, d, tdc.cuda_target(w.q.device), False, plan["comb_unroll"],
                                   plan["fast_math"], plan["comb_smem"])

            def read_as(st, wp, rows):  # the plan's tiles loaded as [rows, D] blocks (a power of two)
                return lambda: kern[(ns, hkv, bsz)](kc, vc, opart, lse, seq, kc.stride(0), kc.stride(1), kc.stride(2),
                                                    ns, tiles * (bn // rows), G=hq // hkv, BLOCK_N=rows, D=d,
                                                    num_warps=wp, num_stages=st)

            # the fastest read of the Triton configs (by its kernel's median duration over a short timeline each)
            durs = {}
            for rows in {r for r in (bn, 64) if r & (r - 1) == 0 and bn % r == 0}:
                for st, wp in ((1, 4), (2, 4), (3, 4), (1, 8), (2, 8), (3, 8)):
                    c, _ = timeline(read_as(st, wp, rows), flush, 40)
                    durs[(st, wp, rows)] = statistics.median(x[0][2] - x[0][1] for x in c) if c else float("inf")
            st, wp, rows = min(durs, key=durs.get)
            read = read_as(st, wp, rows)
            tail += f" read_config=stages{st}_warps{wp}_rows{rows}"

            # the floor of any merge kernel: an empty second kernel, and Triton combines of 32-128 columns a program
            empty, tcomb = _merge_kernels()
            flag = torch.zeros(1, dtype=torch.float32, device="cuda")
            nsp = 1 << max(ns - 1, 0).bit_length()

            def read_then(second):
                return lambda: (read(), second())

            def triton_combine(cols):
                return lambda: tcomb[(d // cols, hq, bsz)](opart, lse, out, ns, hq, D=d, NSP=nsp, COLS=cols,
                                                           num_warps=max(1, min(4, cols * nsp // 1024)))

            studies = [("read", read), ("read + combine", read_then(lambda: comb(opart, lse, out))),
                       ("read + empty kernel", read_then(lambda: empty[(1,)](flag)))]
            read()  # the Triton combines must merge as the plan's combine does (else their rows say NA)
            comb(opart, lse, out)
            want = out.clone()
            ok = {}
            for cols in (c for c in (32, 64, 128) if d % c == 0):
                out.zero_()
                triton_combine(cols)()
                ok[cols] = bool(torch.allclose(out.float(), want.float(), rtol=1e-2, atol=1e-2))
                if ok[cols]:
                    studies.append((f"read + triton combine {cols} cols", read_then(triton_combine(cols))))
            tail += "".join(f" triton_combine_{c}_cols=NA(differs from the plan's combine)" for c in ok if not ok[c])
            for label, fn in studies:
                got, fl = summarize(f"{case.id} {label}", *timeline(fn, flush, a.calls))
                lines += got
                print("\n".join(got), flush=True)
                key = label.replace(" + ", "_").replace(" ", "_")
                tail += f" {key}_span_us={fl.get('span_us', nan):.2f}"
                if "handoff_us" in fl:
                    tail += f" {key}_handoff_us={fl['handoff_us']:.2f}"
        elif a.floor:
            tail += " floor=NA (not a uniform contiguous split + combine plan)"
        print(tail, flush=True)
        tails.append(tail)
    lines += [""] + tails
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(rc)  # skip the interpreter's teardown (CUDA graphs, Triton and TileLang kernels in one process)
