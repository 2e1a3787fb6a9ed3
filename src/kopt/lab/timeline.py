"""`kopt lab timeline`: where a call's time goes between its kernels, each kernel's start and end, cold, on the GPU.

For each case the candidate's call is run cold (kopt's read flush before every call) and launched on the stream
behind a spin kernel (a new one every CHUNK calls), so the host is far ahead and no kernel waits for its launch;
kopt's own profiler session (CUPTI through kineto) records every kernel. Per call, its kernels in start order: start
and end relative to the call's first start; printed per case and kernel as medians over the calls, then the span.
Beside it, each config in place (laid over the plan with '+{..}', as `kopt lab screen` does): by default the plan with
its split partials merged in each row's last CTA (`last_cta` 1) instead of a combine kernel (the same plan, not timed
again, where it merges so already). Time a merge or launch change this way, not as a standalone kernel: a combine
that ran faster alone did not in place (iteration 43). For a plan of two kernels, `handoff_us` is the second's end
past the first's: what the merge adds to the call.

These spans are stream launches (not graph replays): read them against each other, not against RUNTIME.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

from kopt.lab.configs import LabConfig, resolved_config, same_plan

CALLS = 400      # calls timed per case (one profiler session)
MIN_CALLS = 20   # fewer make no median worth printing
HOLD_US = 4000   # the spin kernel ahead of each chunk of them (~2 GHz: 2000 cycles a µs)
CHUNK = 20       # calls launched behind one hold (a call's launches cost the host up to ~100 µs)
DEFAULT_CONFIGS = 'lastcta=+{"last_cta": 1}'  # the same split plan merged in the last CTA: what the combine kernel buys


def record_calls(fn, flush, n: int = CALLS) -> tuple[list[list[tuple[str, float, float]]], int]:
    """Per call (launched behind a hold, each after a flush): its kernels as (name, start µs, end µs) from the call's
    first start, in start order; and how many calls had no device record."""
    import torch

    from kopt.timing import CALL_RANGE, kineto_trace, profiler

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
    """Table rows of one timeline (medians per kernel position) and its numbers: span_us, missing, and handoff_us
    where a call has two kernels. Calls that launched different kernel counts: one NA row with the counts."""
    shapes = {len(c) for c in calls}
    if len(shapes) != 1:
        return [f"| {label} | NA: the calls launched different kernel counts ({sorted(shapes)}) | | | |"], {}
    k = shapes.pop()
    med = statistics.median
    nums = {"span_us": med([max(e for _, _, e in c) for c in calls]), "missing": missing}
    lines = []
    for j in range(k):
        s, e = med([c[j][1] for c in calls]), med([c[j][2] for c in calls])
        d = med([c[j][2] - c[j][1] for c in calls])
        lines.append(f"| {label} | {j}: `{calls[0][j][0][:48]}` | {s:.2f} | {e:.2f} | {d:.2f} |")
    if k == 2:
        nums["handoff_us"] = med([c[1][2] - c[0][2] for c in calls])
    return lines, nums


def run(path: Path, cases: list, configs: list[LabConfig], calls: int = CALLS,
             emit: Callable[[str], None] = print) -> list[str]:
    """The timeline of each case (and of each config in place) with the candidate at `path`; rows and each case's
    summary line go to `emit` as they are measured. Returns the whole table (markdown) with the summary lines."""
    import torch

    from kopt import candidate, hardware, roofline
    from kopt.lab.common import header, host_profile, plan_oracle, workloads
    from kopt.timing import make_flush, rotating
    from kopt.workload import bytes_moved

    mod = candidate.load(path)
    keys = candidate.config_keys(path)
    roof = roofline.for_device("cuda")
    buf = torch.zeros(hardware.flush_bytes(hardware.detect("cuda")), dtype=torch.uint8, device="cuda")
    flush = make_flush(buf, "read")
    head = header(calls=calls) + " (stream launches behind a hold, cold: read flush before each call; medians)"
    emit(head)
    lines = [head, "", "| case / call | kernel | start µs | end µs | duration µs |", "|---|---|---|---|---|"]
    tails = []
    nan = float("nan")
    profile = host_profile()
    for case in cases:
        limit_us = roofline.limit_ms(bytes_moved(case), roof) * 1e3
        ws = workloads(case)
        plan = mod.plan_info(*ws[0].args(), **ws[0].kwargs(None))
        got, nums = summarize(f"{case.id} candidate",
                              *record_calls(rotating(lambda w: mod.run(*w.args(), **w.kwargs(None)), ws), flush,
                                            calls))
        lines += got
        emit("\n".join(got))
        tail = (f"case={case.id} limit_us={limit_us:.2f} plan=block_N {plan.get('block_N')} x "
                f"{plan.get('num_splits')} splits span_us={nums.get('span_us', nan):.2f} "
                f"handoff_us={nums.get('handoff_us', nan):.2f}")
        if nums.get("missing"):
            tail += f" calls_without_records={nums['missing']}"
        for c in configs:  # each config in place: its plan, launched as the candidate launches it
            full = c.full(resolved_config(plan, keys), plan_oracle(mod, case, profile))
            if same_plan(mod.plan_info(*ws[0].args(), **ws[0].kwargs(full)), plan):
                tail += f" {c.label}=same_plan(not timed again)"  # e.g. pdl 0 where no combine kernel follows
                continue
            fn = rotating(lambda w, cfg=full: mod.run(*w.args(), **w.kwargs(cfg)), ws)
            got, cn = summarize(f"{case.id} candidate, {c.label}", *record_calls(fn, flush, calls))
            lines += got
            emit("\n".join(got))
            tail += (f" {c.label}_span_us={cn.get('span_us', nan):.2f}"
                     f" {c.label}_handoff_us={cn.get('handoff_us', nan):.2f}")
        emit(tail)
        tails.append(tail)
    return lines + [""] + tails
