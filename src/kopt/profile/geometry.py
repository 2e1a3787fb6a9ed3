"""Launch geometry arithmetic: resident blocks per unit, waves, the partial last wave.

A "unit" is an SM (NVIDIA) or an AP (MetaX). waves = blocks / (units x resident blocks per unit);
the last wave runs with only the fractional part of the units busy, which is the tail effect.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional

#: Hardware cap on resident blocks per SM for sm_80 / sm_90 (CUDA occupancy tables); an
#: assumption for other parts, stated wherever it is used.
MAX_BLOCKS_PER_SM = 32


def prod(dims) -> Optional[int]:
    """Product of a grid/block given as [x, y, z], {"x":..,"y":..,"z":..}, '(x, y, z)' text or an int."""
    if dims is None:
        return None
    if isinstance(dims, (int, float)):
        return int(dims)
    if isinstance(dims, dict):
        dims = [dims.get(k, 1) for k in ("x", "y", "z")]
    if isinstance(dims, str):
        parts = [p for p in dims.replace("(", " ").replace(")", " ").replace(",", " ").split() if p]
        try:
            dims = [int(float(p)) for p in parts]
        except ValueError:
            return None
    try:
        out = 1
        for d in dims:
            out *= int(d)
        return out
    except (TypeError, ValueError):
        return None


def estimate_blocks_per_unit(threads: int, regs_per_thread: Optional[int], smem_per_block: Optional[int],
                             props: dict) -> tuple[Optional[int], str]:
    """Resident blocks per SM from device limits (no allocation granularity; kopt.occupancy.fit): (blocks, how it was
    found)."""
    from kopt.occupancy import fit

    warp = int(props.get("warpSize") or 32)
    max_threads = props.get("maxThreadsPerMultiprocessor") or props.get("maxThreadsPerMultiProcessor")
    if not threads or not max_threads:
        return None, "device thread limits unknown"

    def n(v):  # a figure as an int; None where the device or the profile gave none
        return int(v) if v else None

    blocks, by = fit(int(threads), n(regs_per_thread), n(smem_per_block), unit_threads=int(max_threads),
                     unit_registers=n(props.get("regsPerMultiprocessor")),
                     unit_smem=n(props.get("sharedMemPerMultiprocessor")), max_ctas=MAX_BLOCKS_PER_SM, warp=warp)
    by = "hw" if by == "CTAs" else by
    return blocks, f"estimated from device limits (bound by {by}; allocation granularity ignored)"


@dataclass
class Waves:
    """How a grid fills the units."""

    blocks: int
    units: int
    blocks_per_unit: Optional[int]
    """Resident blocks per unit (occupancy); None when unknown."""
    capacity_source: str
    grid_per_unit: float
    """blocks / units: below 1, some units get no block at all."""
    waves: Optional[float] = None
    full_waves: Optional[int] = None
    last_wave_fraction: Optional[float] = None
    """Share of the unit slots busy in the last wave (1.0 = a full last wave)."""
    idle_slot_pct: Optional[float] = None
    """Share of all slot-waves left idle by the partial last wave, in %."""

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return asdict(self)


def waves(blocks: int, units: int, blocks_per_unit: Optional[int], source: str = "") -> Waves:
    """Wave arithmetic for one launch; waves stay None when resident blocks per unit are unknown."""
    w = Waves(blocks, units, blocks_per_unit, source, blocks / units if units else float("nan"))
    if not blocks_per_unit or not units:
        return w
    slots = units * blocks_per_unit
    w.waves = blocks / slots
    w.full_waves = int(math.floor(w.waves))
    frac = w.waves - w.full_waves
    w.last_wave_fraction = 1.0 if frac == 0 else frac
    total = math.ceil(w.waves) if w.waves > 0 else 0
    w.idle_slot_pct = 100.0 * (total - w.waves) / total if total else None
    return w


# ---------------------------------------------------------------- work balance of a split-KV plan

@dataclass
class Balance:
    """How evenly a split-KV plan spreads a batch's keys over the units (the tail effect of a ragged batch)."""

    ctas: int
    units: int
    busiest_keys: int
    """Valid keys read by the busiest unit."""
    mean_keys: float
    """All valid keys / units: what each unit would read if the work were spread evenly."""
    imbalance: float
    """busiest_keys / mean_keys: 1.0 is even; the call takes about this much longer than an even spread."""
    idle_pct: float
    """100 x (1 - mean / busiest): the share of the units' time left idle while the busiest one works."""
    plan: str = ""
    """The plan it models, e.g. `block_N 64 x 16 splits, eager`."""


def split_work(lengths: list[int], kv_heads: int, block_N: int, num_splits: int, alloc_len: int,
               eager: bool = False) -> list[int]:
    """Valid keys each CTA of a split-KV decode reads, in launch order (split fastest, then kv head, then
    sequence: grid (num_splits, kv_heads, batch)). Each (sequence, kv head) row is cut into num_splits
    chunks of ceil(tiles / num_splits) tiles of block_N keys, where tiles counts the allocated length
    (alloc_len) with `eager` (the ranges are fixed before the lengths are read) and the row's own length
    otherwise; a chunk past the row's end reads nothing."""
    bn, ns = max(1, int(block_N)), max(1, int(num_splits))
    alloc_tiles = -(-max(1, int(alloc_len)) // bn)
    out: list[int] = []
    for n_keys in lengths:
        tiles = -(-int(n_keys) // bn)
        per = -(-(alloc_tiles if eager else tiles) // ns)
        row = [max(0, min(min((s + 1) * per, tiles) * bn, n_keys) - s * per * bn) for s in range(ns)]
        out += row * kv_heads
    return out


def balance(work: list[int], units: int) -> Optional[Balance]:
    """The busiest unit vs the mean when CTAs are dealt to the units in waves (CTA i on unit i mod units,
    the launch order a block scheduler fills free units in); None without work or units."""
    total = sum(work)
    if not total or not units or units < 1:
        return None
    loads = [0] * units
    for i, w in enumerate(work):
        loads[i % units] += w
    busiest, mean = max(loads), total / units
    return Balance(len(work), units, busiest, mean, busiest / mean, 100.0 * (1 - mean / busiest))


def plan_balance(plan: Optional[dict], lengths: list[int], kv_heads: int, alloc_len: int,
                 units: Optional[int]) -> tuple[Optional[Balance], str]:
    """(Balance of a candidate's plan (its plan_info: block_N, num_splits, eager) on these lengths, why
    None): the plan must name block_N and num_splits."""
    if not units:
        return None, "the unit count is unknown"
    if not plan or not plan.get("block_N") or not plan.get("num_splits"):
        return None, "the candidate's plan (plan_info) does not name block_N and num_splits"
    work = split_work(lengths, kv_heads, int(plan["block_N"]), int(plan["num_splits"]), alloc_len,
                      bool(plan.get("eager")))
    b = balance(work, units)
    if b is None:
        return None, "no valid keys"
    b.plan = f"block_N {plan['block_N']} x {plan['num_splits']} splits" + (", eager" if plan.get("eager") else "")
    return b, ""
