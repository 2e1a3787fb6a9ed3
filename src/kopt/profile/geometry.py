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
    """Resident blocks per SM from device limits (no allocation granularity): (blocks, how it was found)."""
    warp = int(props.get("warpSize") or 32)
    max_threads = props.get("maxThreadsPerMultiprocessor") or props.get("maxThreadsPerMultiProcessor")
    if not threads or not max_threads:
        return None, "device thread limits unknown"
    t = -(-threads // warp) * warp
    limits = {"threads": int(max_threads) // t, "hw": MAX_BLOCKS_PER_SM}
    regs_sm = props.get("regsPerMultiprocessor")
    if regs_per_thread and regs_sm:
        limits["registers"] = int(regs_sm) // (int(regs_per_thread) * t)
    smem_sm = props.get("sharedMemPerMultiprocessor")
    if smem_per_block and smem_sm:
        limits["shared memory"] = int(smem_sm) // int(smem_per_block)
    by = min(limits, key=limits.get)
    return max(0, limits[by]), f"estimated from device limits (bound by {by}; allocation granularity ignored)"


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
