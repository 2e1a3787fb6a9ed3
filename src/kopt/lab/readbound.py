"""`kopt lab readbound`: how close each case can come to its limit: the fastest pure read of its bytes, paired with
the candidate (GPU).

For each case: the bytes a call must move (kopt.workload.bytes_moved), its limit (kopt's roofline:
max(bytes / read ceiling, launch floor)), and the fastest streaming read of exactly those bytes
(kopt.roofline.read_span_ms: Triton reads, one launch, no math, no dependent load, no merge), found with quick
timing and then ABBA-paired with the candidate's own plan by kopt's timer in one process. Beside it, for a uniform
(unbalanced) contiguous plan, the same bytes read in the plan's shape (kopt.lab.reads.shaped_read; NA with the reason
otherwise), and the same read of a head-major copy of the cache, so a gap splits into what the row stride, the grid,
and the math and merge cost. Per case: read µs, candidate µs, the read's % of limit (the most a kernel that only
moves the bytes reaches) and the candidate's time over the read's with its 95% CI; then the geomean of the read's %
of limit over the perf cases, a measured bound on GEOMEAN_PCT_LIMIT, and over the held-out draws (ids past 1000 with a
seed), a measured bound on GEOMEAN_PCT_LIMIT_HELDOUT. Every read's sum is checked against the data.

With layouts (page sizes, 0 = contiguous) each case's valid keys are instead read per layout by one program per
(64-key tile, kv head, batch row) through the block table where paged, quick-timed beside the candidate in the same
layout: what the layout alone costs a read that does no math.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Optional


def shaped_na(case, plan: dict) -> Optional[str]:
    """Why a case gets no plan-shaped read (NA and the reason), or None when it gets one."""
    if plan.get("paged"):
        return "NA: a paged cache"
    if plan.get("balanced"):
        return "NA: a balanced plan (per-row splits)"
    if case.valid_keys != case.batch * case.seqlen_k:
        return "NA: ragged lengths (the shaped read reads the allocated length)"
    return None


def us(x: Optional[float]) -> str:
    """µs with two decimals, NA for None."""
    return "NA" if x is None else f"{x:.2f}"


def by_layout(path: Path, cases: list, sizes: list[int], emit: Callable[[str], None] = print) -> list[str]:
    """Per case and layout the tile read and the candidate, quick-timed; ratios against contiguous."""
    from kopt import candidate, roofline
    from kopt.lab import reads
    from kopt.lab.common import header, workloads
    from kopt.timing import TimingOptions, rotating, time_fn

    mod = candidate.load(path)
    quick = TimingOptions.for_device("cuda", quick=True)
    head = header(layouts=",".join(map(str, sizes)))
    emit(head)
    lines = [head, "", "| case | layout | tile read µs | candidate µs | read / contiguous read "
             "| candidate / contiguous candidate |", "|---|---|---|---|---|---|"]
    for case in cases:
        base = None
        for size in sizes:
            ws = workloads(case.with_variant(page_size=size))
            best = roofline.fastest_read(reads.tile_read(ws[0]), reads.valid_kv(ws[0]), "cuda")[0]
            cand = rotating(lambda w: mod.run(*w.args(), **w.kwargs(None)), ws)
            cand()
            cm = time_fn(cand, "cuda", quick).median_ms
            base = base or (best, cm)
            row = (f"| {case.id} | {'contiguous' if not size else f'{size}-token pages'} | {best * 1e3:.2f} | "
                   f"{cm * 1e3:.2f} | {best / base[0]:.3f} | {cm / base[1]:.3f} |")
            emit(row)
            lines.append(row)
    return lines


def run(path: Path, cases: list, emit: Callable[[str], None] = print, seed: Optional[int] = None) -> list[str]:
    """The read bound of each case with the candidate at `path`; one line per case to `emit`, the geomeans last
    (`seed`: the held-out draw's, named in the header). Returns the table (markdown)."""
    from kopt import candidate, roofline
    from kopt.lab import reads
    from kopt.lab.common import header, workloads
    from kopt.policy.ranking import plan_class
    from kopt.timing import TimingOptions, rotating, time_pair
    from kopt.workload import bytes_moved

    mod = candidate.load(path)
    opts = TimingOptions.for_device("cuda")
    roof = roofline.for_device("cuda")
    facts = {} if seed is None else {"heldout_seed": seed}
    head = header(read_gbps=f"{roof.read_gbps:.0f}", floor_us=f"{roof.floor_ms * 1e3:.2f}", **facts)
    emit(head)
    rows = []
    for case in cases:
        nbytes = bytes_moved(case)
        limit = roofline.limit_ms(nbytes, roof)
        _, how, read = roofline.read_span_ms("cuda", nbytes, quick=True)
        ws = workloads(case)
        cand = rotating(lambda w: mod.run(*w.args(), **w.kwargs(None)), ws)
        cand()
        pt = time_pair(cand, read, "cuda", opts)  # its speedup: read / candidate
        r_ms, c_ms = pt.b.median_ms, pt.a.median_ms
        plan = mod.plan_info(*ws[0].args(), **ws[0].kwargs(None))
        hm_ms, shaped_ms, shaped_how = None, None, shaped_na(case, plan)
        if shaped_how is None:
            kv = ws[0].k_cache, ws[0].v_cache
            bn, ns = plan["block_N"], plan["num_splits"]
            shaped_ms, shaped_how, _ = roofline.fastest_read(reads.shaped_read(ws[0], bn, ns), kv, "cuda")
            hm_ms = roofline.fastest_read(reads.shaped_read(ws[0], bn, ns, head_major=True), kv, "cuda")[0]
        row = dict(case=case.id, kind=case.kind, plan=plan_class(plan, limit <= roof.floor_ms),
                   bytes=nbytes, limit_us=limit * 1e3, read_us=r_ms * 1e3,
                   cand_us=c_ms * 1e3, read_pct=100 * limit / r_ms, cand_pct=100 * limit / c_ms,
                   ratio=1 / pt.speedup, lo=1 / pt.ci[1], hi=1 / pt.ci[0], how=how,
                   shaped_us=None if shaped_ms is None else shaped_ms * 1e3, shaped_how=shaped_how,
                   hm_us=None if hm_ms is None else hm_ms * 1e3)
        rows.append(row)
        emit(f"case={case.id} bytes={nbytes} limit_us={row['limit_us']:.2f} read_us={row['read_us']:.2f} "
             f"cand_us={row['cand_us']:.2f} plan=\"{row['plan']}\" read_pct_limit={row['read_pct']:.1f} "
             f"cand_pct_limit={row['cand_pct']:.1f} "
             f"cand_over_read={row['ratio']:.3f} ci={row['lo']:.3f}-{row['hi']:.3f} read=\"{how}\" "
             f"shaped_us={us(row['shaped_us'])} shaped_head_major_us={us(row['hm_us'])} shaped=\"{shaped_how}\"")
    return [head, ""] + table(rows, emit)


def table(rows: list[dict], emit: Callable[[str], None] = print) -> list[str]:
    """The markdown table of readbound's rows, why a row's plan-shaped read is NA (its reason, with its cases), and the
    geomeans (emitted too) over the perf cases and over the held-out draws, each where there are any."""
    lines = ["| case | plan | MB | limit µs | read µs | plan-shaped read µs | the same, head-major µs "
             "| candidate µs | read % of limit | candidate % of limit | candidate / read (95% CI) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r.get('plan', 'NA')} | {r['bytes'] / 1e6:.2f} | {r['limit_us']:.2f} | "
                     f"{r['read_us']:.2f} | "
                     f"{us(r['shaped_us'])} | {us(r['hm_us'])} | {r['cand_us']:.2f} | {r['read_pct']:.1f} | "
                     f"{r['cand_pct']:.1f} | {r['ratio']:.3f} ({r['lo']:.3f}-{r['hi']:.3f}) |")
    why: dict[str, list[str]] = {}  # a plan-shaped read's NA reason (shaped_na) -> its cases
    for r in rows:
        if r["shaped_us"] is None and str(r.get("shaped_how") or "").startswith("NA: "):
            why.setdefault(r["shaped_how"].removeprefix("NA: "), []).append(str(r["case"]))
    if why:
        lines += ["", "plan-shaped reads NA: " + "; ".join(f"{k} ({', '.join(v)})" for k, v in why.items())]
    for kind, what in (("perf", "perf cases"), ("heldout", "held-out draws")):
        sel = [r for r in rows if r["kind"] == kind]
        if not sel:
            continue
        tail = (f"geomean over {len(sel)} {what}: read % of limit {_geomean(sel, 'read_pct'):.1f}, candidate % of "
                f"limit {_geomean(sel, 'cand_pct'):.1f}, candidate / read {_geomean(sel, 'ratio'):.3f}")
        emit(tail)
        lines += ["", tail]
        if kind == "heldout":
            lines += by_class(sel, emit)
    return lines


def by_class(rows: list[dict], emit: Callable[[str], None] = print) -> list[str]:
    """Held-out draws grouped by plan class (policy.ranking.plan_class): per class the draws, the geomeans of the
    read's and the candidate's % of limit, the candidate over the read, and the geomean over all `rows` if that class
    alone ran at its read (where a kernel change would pay most)."""
    out = ["", "| plan class | draws | read % of limit | candidate % of limit | candidate / read "
               "| all draws' candidate % of limit with this class at its read |", "|---|---|---|---|---|---|"]
    for cls in sorted({r.get("plan", "NA") for r in rows}):
        sel = [r for r in rows if r.get("plan", "NA") == cls]
        alt = _geomean([{"v": r["read_pct"] if r.get("plan", "NA") == cls else r["cand_pct"]} for r in rows], "v")
        read, cand, ratio = (_geomean(sel, k) for k in ("read_pct", "cand_pct", "ratio"))
        emit(f"class=\"{cls}\" draws={len(sel)} read_pct_limit={read:.1f} cand_pct_limit={cand:.1f} "
             f"cand_over_read={ratio:.3f} all_at_read={alt:.1f}")
        out.append(f"| {cls} | {len(sel)} | {read:.1f} | {cand:.1f} | {ratio:.3f} | {alt:.1f} |")
    return out


def _geomean(rows: list[dict], key: str) -> float:
    return math.exp(sum(math.log(r[key]) for r in rows) / len(rows))
