"""The roofline of a decode call: a measured read ceiling, a launch floor, and the per-case limit.

limit = max(bytes a call must move / read ceiling, launch floor); `% of limit` = limit / runtime. The
read ceiling is a streaming read of READ_BYTES (the traffic of the largest decode calls, far past L2),
best of several reads and of two kernels (a Triton read where Triton imports, torch's sum); the copy
ceiling stays beside it for reference. The floor is the cold, device-only span of a minimal kernel
that loads one [64, 128] tile and stores one row, timed by kopt's own CUDA timer. Both are measured
once per device and cached with the copy ceiling in results/hardware-<device>.json.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

from kopt import hardware

#: Bytes of the read that measures the ceiling: >= 4 GiB, the traffic of a long decode call, ~70x L2.
READ_BYTES = 4 << 30


@dataclass(frozen=True)
class Roofline:
    """One device's measured ceilings and floor."""

    read_gbps: float
    copy_gbps: float
    floor_ms: float


def limit_ms(nbytes: int, roof: Roofline) -> float:
    """The fastest a call moving nbytes can be: max(bytes / read ceiling, launch floor), in ms."""
    return max(nbytes / (roof.read_gbps * 1e9) * 1e3, roof.floor_ms)


def pct_limit(limit: float, runtime_ms: float) -> float:
    """limit / runtime as %: 100 is at the roofline."""
    return 100.0 * limit / runtime_ms


def _events_best_ms(fn: Callable[[], object], reps: int) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    best = float("inf")
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        a.record()
        fn()
        b.record()
        b.synchronize()
        best = min(best, a.elapsed_time(b))
    return best


def _triton_read(words):
    """A streaming read in Triton (16 KB a program per step, 16 steps), or None without Triton."""
    try:
        import torch
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def _read(x, out, n, BLOCK: tl.constexpr, STEPS: tl.constexpr):
        base = tl.program_id(0).to(tl.int64) * BLOCK * STEPS
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for i in range(STEPS):
            offs = base + i * BLOCK + tl.arange(0, BLOCK)
            acc += tl.load(x + offs, mask=offs < n, other=0.0)
        tl.store(out + tl.program_id(0), tl.sum(acc))

    block, steps = 4096, 16
    grid = (triton.cdiv(words.numel(), block * steps),)
    sink = torch.empty(grid[0], dtype=torch.float32, device=words.device)
    return lambda: _read[grid](words, sink, words.numel(), BLOCK=block, STEPS=steps, num_warps=8)


def measure_read_gbps(device: str, nbytes: int = READ_BYTES, reps: int = 10) -> tuple[float, str]:
    """Best streaming-read bandwidth (bytes read / s / 1e9) over the read kernels here, and its name."""
    import torch

    buf = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)
    sink = torch.zeros(1, dtype=torch.float32, device=device)
    kernels = {"torch-sum": lambda: torch.sum(buf, dim=0, keepdim=True, out=sink)}
    try:
        tr = _triton_read(buf)
        if tr is not None:
            tr()  # compiles here: a failure falls back to torch's sum
            kernels = {"triton-read": tr, **kernels}
    except Exception:
        pass
    best = {name: buf.numel() * 4 / (_events_best_ms(fn, reps) / 1e3) / 1e9 for name, fn in kernels.items()}
    del buf
    name = max(best, key=best.get)
    return best[name], f"{name}-events-best-of-{reps}"


def measure_floor_ms(device: str) -> float:
    """Cold device-only span of a minimal kernel: one [64, 128] fp16 tile loaded, one row stored."""
    import torch

    from kopt.timing import TimingOptions, time_fn

    tile = torch.randn(64, 128, dtype=torch.float16, device=device)
    row = torch.empty(1, 128, dtype=torch.float16, device=device)
    fn = lambda: torch.sum(tile, dim=0, keepdim=True, out=row)  # noqa: E731
    fn()
    return time_fn(fn, device, TimingOptions.for_device(device)).median_ms


def for_device(device: str, cache_dir: Optional[Path] = None, *, refresh: bool = False,
               measure_read=None, measure_floor=None) -> Optional[Roofline]:
    """The device's roofline, measured once and cached beside its copy ceiling; None on the CPU."""
    if hardware.is_cpu(device):
        return None
    copy = hardware.copy_ceiling_gbps(device, cache_dir, refresh=refresh)
    info = hardware.detect(device)
    entry = hardware.read_cached(info.name, cache_dir)
    if entry is None or copy is None:
        return None
    if refresh or entry.read_gbps is None or entry.floor_ms is None:
        from kopt.vcs import head_short

        gbps, how = (measure_read or measure_read_gbps)(device)
        floor = (measure_floor or measure_floor_ms)(device)
        entry = entry.model_copy(update={
            "read_gbps": gbps, "read_bytes": READ_BYTES, "read_method": how, "floor_ms": floor,
            "floor_method": "cold device-only span (kopt timer) of a [64,128] fp16 tile sum into one row",
            "roofline_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "commit": head_short(Path.cwd())})
        hardware.write_cached(entry, cache_dir)
    return Roofline(read_gbps=entry.read_gbps, copy_gbps=entry.copy_gbps, floor_ms=entry.floor_ms)
