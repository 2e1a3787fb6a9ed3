"""The roofline of a decode call: a measured read ceiling, a launch floor, and the per-case limit.

limit = max(bytes a call must move / read ceiling, launch floor); `% of limit` = limit / runtime. The
read ceiling is a streaming read of READ_BYTES (the traffic of the largest decode calls, far past L2),
best of several reads and kernels (Triton reads where Triton imports, torch's sum); the copy ceiling
stays beside it for reference. The floor is the cold, device-only span of a minimal kernel that loads
one [64, 128] tile and stores one row, timed by kopt's own CUDA timer. Both are measured
once per device and cached with the copy ceiling in results/hardware-<device>.json.
read_span_ms times a read of one call's bytes (what a kernel that only moved them would take), for the
read-bound study of `kopt lab readbound` (kopt.lab.readbound); it is never cached.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

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


@functools.cache
def _steps_kernel():
    """The Triton streaming read: each program sums STEPS blocks of BLOCK fp32 words (unrolled: every step's load
    is in flight before the adds) and stores one word."""
    import triton
    import triton.language as tl

    @triton.jit
    def _steps(x, out, n, BLOCK: tl.constexpr, STEPS: tl.constexpr):
        base = tl.program_id(0).to(tl.int64) * BLOCK * STEPS
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for i in tl.static_range(STEPS):
            offs = base + i * BLOCK + tl.arange(0, BLOCK)
            acc += tl.load(x + offs, mask=offs < n, other=0.0)
        tl.store(out + tl.program_id(0), tl.sum(acc))

    return _steps


def _step_read(words, block: int, steps: int, warps: int):
    """(fn, sink): one launch of the streaming read over fp32 `words`, its per-program sums in sink."""
    import torch
    import triton

    grid = (triton.cdiv(words.numel(), block * steps),)
    sink = torch.empty(grid[0], dtype=torch.float32, device=words.device)
    kernel = _steps_kernel()

    def fn():
        kernel[grid](words, sink, words.numel(), BLOCK=block, STEPS=steps, num_warps=warps)

    return fn, sink


def _triton_reads(words) -> dict:
    """Streaming reads in Triton (none without Triton): unrolled 16 KB steps, and one 64 KB load a program."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return {}
    return {name: _step_read(words, block, steps, warps)[0]
            for name, block, steps, warps in (("triton-unrolled", 2048, 8, 4), ("triton-wide", 16384, 1, 8))}


def measure_read_gbps(device: str, nbytes: int = READ_BYTES, reps: int = 10) -> tuple[float, str]:
    """Best streaming-read bandwidth (bytes read / s / 1e9) over the read kernels here, and its name.

    Each kernel reads nbytes once from one buffer, and a quarter-size buffer four times back to back
    (the same traffic; each pass comes from DRAM, the buffer being ~17x L2): a ceiling is the best the
    memory system does, so the best of both and of every kernel is taken."""
    import torch

    best: dict[str, float] = {}
    for parts in (1, 4):
        buf = torch.zeros(nbytes // 4 // parts, dtype=torch.float32, device=device)
        sink = torch.zeros(1, dtype=torch.float32, device=device)
        kernels = {"torch-sum": lambda buf=buf, sink=sink: torch.sum(buf, dim=0, keepdim=True, out=sink)}
        try:
            kernels.update(_triton_reads(buf))
        except Exception:  # no usable Triton: torch's sum alone
            pass
        for name, fn in kernels.items():
            try:
                ms = hardware.events_best_ms(lambda: [fn() for _ in range(parts)], reps, device)
            except Exception:  # a kernel that does not compile here is not a ceiling
                continue
            best[f"{name}-{nbytes // parts >> 20}MiBx{parts}"] = nbytes / (ms / 1e3) / 1e9
        del buf
        torch.cuda.empty_cache()
    name = max(best, key=best.get)
    return best[name], f"{name}-events-best-of-{reps}"


#: Read kernels of read_span_ms: (words a step, steps a program, warps); every step's load is in flight at once
SPAN_READS = ((1024, 1, 4), (1024, 4, 4), (1024, 8, 4), (2048, 8, 8), (2048, 16, 8), (4096, 4, 8), (4096, 16, 8))


def check_read_sum(sink, *tensors) -> None:
    """A read kernel's per-program sums must add up to the sum of what it was to read (a read that skipped bytes
    would time fast and bound nothing): RuntimeError otherwise, within fp32 summation-order error."""
    got = float(sink.double().sum())
    want = sum(float(t.double().sum()) for t in tensors)
    scale = sum(float(t.double().abs().sum()) for t in tensors)
    if abs(got - want) > 1e-5 * scale + 1e-3:
        raise RuntimeError(f"read kernel summed {got:.6g}, the data sums to {want:.6g}: it did not read every byte")


def read_span_ms(device: str, nbytes: int, quick: bool = False):
    """(ms, name, fn): the cold device-only span (kopt's timer) of the fastest streaming read of nbytes over
    SPAN_READS (Triton, one launch that reads the bytes once and stores one word a program), which read it was,
    and the read itself (to pair with a call): what a kernel that only moved a call's bytes, with no math, no
    dependent load and no merge, would take."""
    import torch

    words = torch.randn(max(1, nbytes // 4), dtype=torch.float32, device=device)
    reads = []
    for block, steps, warps in SPAN_READS:
        fn, sink = _step_read(words, block, steps, warps)
        reads.append((fn, sink, f"triton read {block * 4 >> 10} KB x {steps} steps a program, {sink.numel()} "
                                f"programs, {warps} warps"))
    return fastest_read(reads, [words], device, quick)


def fastest_read(reads, data, device: str, quick: bool = True):
    """(ms, name, fn) of the fastest of `reads`, (fn, sink, name) each, timed by kopt's timer (quick by default);
    each read's sums are first checked against `data`, the tensors it was to read (check_read_sum; its sink zeroed
    first, so a program that has nothing to read and stores nothing adds nothing)."""
    from kopt.timing import TimingOptions, time_fn

    opts = TimingOptions.for_device(device, quick=quick)
    best = None
    for fn, sink, name in reads:
        sink.zero_()
        fn()
        check_read_sum(sink, *data)
        ms = time_fn(fn, device, opts).median_ms
        if best is None or ms < best[0]:
            best = (ms, name, fn)
    return best


def _floor_kernel(tile, row):
    """Triton: one program loads the [64, 128] tile and stores its column sums into one row."""
    import triton
    import triton.language as tl

    @triton.jit
    def _one_tile(t, r, M: tl.constexpr, N: tl.constexpr):
        offs = tl.arange(0, M)[:, None] * N + tl.arange(0, N)[None, :]
        x = tl.load(t + offs).to(tl.float32)
        tl.store(r + tl.arange(0, N), tl.sum(x, axis=0).to(r.dtype.element_ty))

    return lambda: _one_tile[(1,)](tile, row, M=tile.shape[0], N=tile.shape[1], num_warps=4)


def measure_floor_ms(device: str) -> tuple[float, str]:
    """Cold device-only span of a minimal kernel: one [64, 128] fp16 tile loaded, one row stored (a
    one-program Triton kernel where Triton imports, else torch's column sum), and how it was made."""
    import torch

    from kopt.timing import TimingOptions, time_fn

    tile = torch.randn(64, 128, dtype=torch.float16, device=device)
    row = torch.empty(128, dtype=torch.float16, device=device)
    how = "triton one-program [64,128] fp16 tile load + row store"
    try:
        fn = _floor_kernel(tile, row)
        fn()
    except Exception:  # no Triton here
        fn = lambda: torch.sum(tile, dim=0, out=row)  # noqa: E731
        how = "torch column sum of a [64,128] fp16 tile into one row"
        fn()
    st = time_fn(fn, device, TimingOptions.for_device(device))
    return st.median_ms, f"cold device-only span (kopt timer) of a {how}"


def for_device(device: str, cache_dir: Optional[Path] = None, *, refresh: bool = False,
               measure_read=None, measure_floor=None) -> Optional[Roofline]:
    """The device's roofline, measured once and cached beside its copy ceiling; None on the CPU."""
    if hardware.is_cpu(device):
        return None
    info = hardware.detect(device)
    entry = None if refresh else hardware.read_cached(info.name, cache_dir)
    if entry is None:  # the copy ceiling first (measured and cached), the entry the rest is added to
        hardware.copy_ceiling_gbps(device, cache_dir, refresh=refresh)
        entry = hardware.read_cached(info.name, cache_dir)
    if entry is None:
        return None
    if refresh or entry.read_gbps is None or entry.floor_ms is None:
        from kopt.store import head_short

        gbps, how = (measure_read or measure_read_gbps)(device)
        floor, floor_how = (measure_floor or measure_floor_ms)(device)
        entry = entry.model_copy(update={
            "read_gbps": gbps, "read_bytes": READ_BYTES, "read_method": how, "floor_ms": floor,
            "floor_method": floor_how,
            "roofline_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "commit": head_short(Path.cwd())})
        hardware.write_cached(entry, cache_dir)
    return Roofline(read_gbps=entry.read_gbps, copy_gbps=entry.copy_gbps, floor_ms=entry.floor_ms)
