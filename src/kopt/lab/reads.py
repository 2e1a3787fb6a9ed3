"""The read bound's Triton reads (GPU, Triton): a case's bytes read with no math, in the plan's shape or per page
layout, each storing one word per program so kopt.roofline.check_read_sum can prove it read every byte.

Each builder returns (fn, sink, name) candidates for kopt.roofline.fastest_read, which times them and keeps the
fastest. The kernels are compiled on first use (functools.cache), so importing this module needs no Triton.
"""

from __future__ import annotations

import functools


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
