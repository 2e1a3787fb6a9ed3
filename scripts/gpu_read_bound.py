"""How close each case can come to its limit: the fastest pure read of its bytes, paired with the candidate.

For each case: the bytes a call must move (kopt.workload.bytes_moved), its limit (kopt's roofline:
max(bytes / read ceiling, launch floor)), and the fastest streaming read of exactly those bytes
(kopt.roofline.read_span_ms: Triton reads, one launch, no math, no dependent load, no merge), found with quick
timing and then ABBA-paired with the candidate's own plan by kopt's timer (device-only cold spans, graph
replays, full stopping rule) in one process. Beside it, for a uniform (unbalanced) contiguous plan, the same
bytes read in the plan's shape: one program per (split, kv head, batch row) reading its key range's K and V
tiles of the plan's block_N, [block_N, D] loads of rows Hkv x D apart, nothing computed (`shaped_us`; NA
with the reason otherwise), and the same read of a head-major copy of the cache (a head's rows contiguous),
so a gap splits into what the row stride, the grid, and the math and merge cost. Printed per case: read µs,
candidate µs, the read's % of limit (the most a kernel that only moves the bytes reaches) and the
candidate's time over the read's with its 95% CI; then the geomean of the read's % of limit over the perf
cases, a measured bound on GEOMEAN_PCT_LIMIT. Every read's sum is checked against the data it was to read
(kopt.roofline.fastest_read, check_read_sum).

With --layouts 0,16,256 (contiguous and page sizes) each case's valid keys are instead read per layout by one program
per (64-key tile, kv head, batch row) through the block table where paged (tiles past a row's length exit), quick-timed
beside the candidate in the same layout: what the layout alone costs a read that does no math.

Run from the workspace root:  PYTHONPATH=src python3 scripts/gpu_read_bound.py --cases 4-18 [--out FILE.md]
                              PYTHONPATH=src python3 scripts/gpu_read_bound.py --cases 15-18 --layouts 0,16,256
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.cache
def _tiles_kernel():
    """The plan-shaped read: program (split, kv head, batch row) sums its range's K and V tiles of [BLOCK_N, D] rows
    at the cache's row stride and stores one word."""
    import triton
    import triton.language as tl

    @triton.jit
    def _tiles(k, v, out, S, sb, ss, sh, H, NS, TILES, BLOCK_N: tl.constexpr, D: tl.constexpr):
        sid, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        acc = tl.zeros([BLOCK_N, D], dtype=tl.float32)
        cols = tl.arange(0, D)[None, :]
        for t in range(TILES):
            rows = (sid * TILES + t) * BLOCK_N + tl.arange(0, BLOCK_N)
            off = b.to(tl.int64) * sb + rows[:, None].to(tl.int64) * ss + h.to(tl.int64) * sh + cols
            m = rows[:, None] < S
            acc += tl.load(k + off, mask=m, other=0.0).to(tl.float32)
            acc += tl.load(v + off, mask=m, other=0.0).to(tl.float32)
        tl.store(out + (b * H + h) * NS + sid, tl.sum(acc))

    return _tiles


@functools.cache
def _tile_kernel():
    """The per-layout read: program (tile, kv head, batch row) sums the tile's valid K and V rows (through the block
    table where paged; a tile past the row's length exits) and stores one word."""
    import triton
    import triton.language as tl

    @triton.jit
    def _tile(k, v, lens, bt, out, sb, ss, maxp, H, PAGED: tl.constexpr, P: tl.constexpr, BLOCK_N: tl.constexpr,
              D: tl.constexpr):
        t, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        n = tl.load(lens + b)
        if t * BLOCK_N < n:
            rows = t * BLOCK_N + tl.arange(0, BLOCK_N)
            m = rows < n
            if PAGED:
                page = tl.load(bt + b * maxp + rows // P, mask=m, other=0).to(tl.int64)
                base = page * (P * H * D) + (rows % P).to(tl.int64) * (H * D)
            else:
                base = b.to(tl.int64) * sb + rows.to(tl.int64) * ss
            off = base[:, None] + h * D + tl.arange(0, D)[None, :]
            x = tl.load(k + off, mask=m[:, None], other=0.0).to(tl.float32)
            x += tl.load(v + off, mask=m[:, None], other=0.0).to(tl.float32)
            tl.store(out + (b * H + h) * tl.num_programs(0) + t, tl.sum(x))

    return _tile


def shaped_read(w, block_n: int, splits: int, head_major: bool = False):
    """(fn, sink, name) candidates: a Triton read of w's K and V in a split plan's shape (grid splits x Hkv x B, each
    program its range's tiles, tl.load of [block_n, D] rows at the cache's row stride), at 1-3 stages, 4/8
    warps; one word stored per program. head_major: the same bytes copied to [B, Hkv, S, D] first, so a head's
    rows are contiguous (what the contract's [B, S, Hkv, D] row stride costs the same grid)."""
    import torch

    kernel = _tiles_kernel()
    kc, vc = w.k_cache, w.v_cache
    bsz, seq, hkv, d = kc.shape
    sb, ss, sh = kc.stride(0), kc.stride(1), kc.stride(2)
    if head_major:
        kc, vc = kc.permute(0, 2, 1, 3).contiguous(), vc.permute(0, 2, 1, 3).contiguous()
        sb, ss, sh = kc.stride(0), kc.stride(2), kc.stride(1)
    tiles = ((seq + block_n - 1) // block_n + splits - 1) // splits
    load_n = block_n if block_n & (block_n - 1) == 0 else 64  # Triton's blocks are powers of two: 192 as 3 x 64
    tiles, block_n = tiles * (block_n // load_n), load_n
    sink = torch.empty(bsz * hkv * splits, dtype=torch.float32, device=kc.device)
    out = []
    for stages in (1, 2, 3):
        for warps in (4, 8):
            def fn(st=stages, wp=warps):
                kernel[(splits, hkv, bsz)](kc, vc, sink, seq, sb, ss, sh, hkv, splits, tiles,
                                           BLOCK_N=block_n, D=d, num_warps=wp, num_stages=st)
            out.append((fn, sink, f"triton {splits}x{hkv}x{bsz} programs, {tiles} tiles of {block_n} keys, "
                                  f"{stages} stages, {warps} warps" + (", head-major copy" if head_major else "")))
    return out


def tile_read(w, block_n: int = 64):
    """(fn, sink, name) candidates: a Triton read of w's valid keys, one program per (tile, kv head, batch row) of
    the allocated length (a tile past the row's length exits), rows through the block table when w is paged; 4/8
    warps."""
    import torch

    kernel = _tile_kernel()
    kc, vc, bt = w.k_cache, w.v_cache, w.block_table
    paged = bt is not None
    hkv, d = kc.shape[2], kc.shape[3]
    bsz = w.q.shape[0]
    alloc = bt.shape[1] * kc.shape[1] if paged else kc.shape[1]
    grid = ((alloc + block_n - 1) // block_n, hkv, bsz)
    sink = torch.zeros(grid[0] * hkv * bsz, dtype=torch.float32, device=kc.device)
    dummy = torch.zeros(1, dtype=torch.int32, device=kc.device)
    out = []
    for warps in (4, 8):
        def fn(wp=warps):
            kernel[grid](kc, vc, w.cache_seqlens, bt if paged else dummy, sink, kc.stride(0), kc.stride(1),
                         bt.shape[1] if paged else 0, hkv, PAGED=paged, P=kc.shape[1] if paged else 1,
                         BLOCK_N=block_n, D=d, num_warps=wp)
        out.append((fn, sink, f"triton tile read {grid[0]}x{hkv}x{bsz} programs of {block_n} keys, {warps} warps"))
    return out


def valid_kv(w):
    """The K and V rows a call must read: each row's first cache_seqlens[b] keys, in the contiguous layout."""
    import torch

    k, v = w.logical_kv()
    n = w.cache_seqlens.tolist()
    return (torch.cat([k[b, :n[b]].reshape(-1) for b in range(len(n))]),
            torch.cat([v[b, :n[b]].reshape(-1) for b in range(len(n))]))


def layouts(cases, sizes: list[int], mod) -> list[str]:
    """--layouts: per case and layout the tile read and the candidate, quick-timed; ratios against contiguous."""
    from kopt import roofline
    from kopt.timing import TimingOptions, rotating, time_fn
    from kopt.workload import make_workload

    quick = TimingOptions.for_device("cuda", quick=True)
    lines = ["| case | layout | tile read µs | candidate µs | read / contiguous read | candidate / contiguous "
             "candidate |", "|---|---|---|---|---|---|"]
    for case in cases:
        base = None
        for size in sizes:
            c = case.with_variant(page_size=size)
            ws = [make_workload(c, seed, "cuda") for seed in (0, 1, 2)]
            best = roofline.fastest_read(tile_read(ws[0]), valid_kv(ws[0]), "cuda")[0]
            cand = rotating(lambda w: mod.run(*w.args(), **w.kwargs(None)), ws)
            cand()
            cm = time_fn(cand, "cuda", quick).median_ms
            base = base or (best, cm)
            row = (f"| {case.id} | {'contiguous' if not size else f'{size}-token pages'} | {best * 1e3:.2f} | "
                   f"{cm * 1e3:.2f} | {best / base[0]:.3f} | {cm / base[1]:.3f} |")
            print(row, flush=True)
            lines.append(row)
    return lines


def _shaped_na(case, plan) -> str | None:
    """Why a case gets no plan-shaped read (NA and the reason), or None when it gets one."""
    if plan.get("paged"):
        return "NA: a paged cache"
    if plan.get("balanced"):
        return "NA: a balanced plan (per-row splits)"
    if case.valid_keys != case.batch * case.seqlen_k:
        return "NA: ragged lengths (the shaped read reads the allocated length)"
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="4-18", help="case ids: 10,14 or 4-18")
    ap.add_argument("--out", help="also write the table (markdown) here")
    ap.add_argument("--layouts", help="comma-separated page sizes, 0 = contiguous: the per-layout tile read instead")
    a = ap.parse_args(argv)
    try:
        sizes = [int(x) for x in a.layouts.split(",")] if a.layouts else []
    except ValueError:
        print(f"error: --layouts takes page sizes like 0,16,256, got {a.layouts!r}", file=sys.stderr)
        return 2
    sys.path.insert(0, os.path.join(ROOT, "src"))
    from kopt import hardware

    hardware.exit_unless_cuda(os.path.basename(__file__))  # a GPU tool on a host without one: one line, exit 2

    from kopt import candidate, roofline
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
    if a.layouts:
        lines = [head, ""] + layouts(select(load_cases(), parse_ids(a.cases)), sizes, mod)
        if a.out:
            with open(a.out, "w") as f:
                f.write("\n".join(lines) + "\n")
        return 0
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
        plan = mod.plan_info(*ws[0].args(), **ws[0].kwargs(None))
        hm_ms, shaped_ms, shaped_how = None, None, _shaped_na(case, plan)
        if shaped_how is None:
            kv = ws[0].k_cache, ws[0].v_cache
            shaped_ms, shaped_how, _ = roofline.fastest_read(shaped_read(ws[0], plan["block_N"], plan["num_splits"]),
                                                             kv, "cuda")
            hm_ms = roofline.fastest_read(shaped_read(ws[0], plan["block_N"], plan["num_splits"], head_major=True),
                                          kv, "cuda")[0]
        row = dict(case=case.id, kind=case.kind, bytes=nbytes, limit_us=limit * 1e3, read_us=r_ms * 1e3,
                   cand_us=c_ms * 1e3, read_pct=100 * limit / r_ms, cand_pct=100 * limit / c_ms,
                   ratio=1 / pt.speedup, lo=1 / pt.ci[1], hi=1 / pt.ci[0], how=how,
                   shaped_us=None if shaped_ms is None else shaped_ms * 1e3, shaped_how=shaped_how,
                   hm_us=None if hm_ms is None else hm_ms * 1e3)
        rows.append(row)
        print(f"case={case.id} bytes={nbytes} limit_us={row['limit_us']:.2f} read_us={row['read_us']:.2f} "
              f"cand_us={row['cand_us']:.2f} read_pct_limit={row['read_pct']:.1f} cand_pct_limit={row['cand_pct']:.1f} "
              f"cand_over_read={row['ratio']:.3f} ci={row['lo']:.3f}-{row['hi']:.3f} read=\"{how}\" "
              f"shaped_us={_us(row['shaped_us'])} shaped_head_major_us={_us(row['hm_us'])} shaped=\"{shaped_how}\"",
              flush=True)
    perf = [r for r in rows if r["kind"] == "perf"]
    lines = [head, "", "| case | MB | limit µs | read µs | plan-shaped read µs | the same, head-major µs "
             "| candidate µs | read % of limit | candidate % of limit | candidate / read (95% CI) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['bytes'] / 1e6:.2f} | {r['limit_us']:.2f} | {r['read_us']:.2f} | "
                     f"{_us(r['shaped_us'])} | {_us(r['hm_us'])} | "
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


def _us(x) -> str:
    return "NA" if x is None else f"{x:.2f}"


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush(), sys.stderr.flush()
    # every row is printed and written by now; skip the interpreter's teardown, where the --layouts run (Triton
    # kernels, CUDA graphs and the candidate's TileLang kernels in one process) aborted (munmap_chunk, rc 134)
    os._exit(rc)
