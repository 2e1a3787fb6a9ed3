"""Timing: cold CUPTI kernel spans, hot CUDA-graph replay, the host clock on CPU, ABBA pairs.

On CUDA each timed call runs inside a `kopt::call` profiler range; its device time is the span
from the first to the last device activity (kernel, memset, memcpy) whose launch happened inside
that range, so a split kernel and its combine both count and the flush (in `kopt::flush`) never
does. CUDA events around every call are recorded too, as a cross-check (they add launch overhead).
"""

from __future__ import annotations

import bisect
import math
import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import reduce
from typing import Callable, Optional, Sequence

import numpy as np

from kopt import stats
from kopt.results import TimingStats
from kopt.stats import StopRule

CALL_RANGE = "kopt::call"
FLUSH_RANGE = "kopt::flush"
#: Batches whose SM clock reads below this fraction of the default clock are dropped (throttled).
LOW_CLOCK_FRAC = 0.75
#: Calls per profiler session: the first batch, then doubling up to the cap. A session costs
#: ~10 ms of host time on an H200 (torch 2.11), so 200 calls keep that small, and a session's
#: kineto buffers stay a few thousand events.
MAX_BATCH = 200
#: CUPTI is trusted when at most this fraction of calls lacks device records; else events.
MAX_MISSING = 0.1
_FLOOR_MS = 1e-6          # TimingStats wants > 0; a host call can read 0 ns

# Bound once at import (the worker imports this module before any candidate): a candidate that patches
# time.perf_counter later cannot change what the harness reads.
_clock, _clock_ns = time.perf_counter, time.perf_counter_ns


def _is_cpu(device: str) -> bool:
    return device == "cpu" or device.startswith("cpu:")


@dataclass
class TimingOptions:
    """How to time: cold (flushed L2) or hot (graph replay), warm-up, rounds, stopping rule."""

    cold: bool = True
    graph: bool = False
    rounds: int = 6
    warmup_s: float = 0.025
    warmup_calls: int = 10
    stop: StopRule = field(default_factory=StopRule)
    batch: int = 50
    """Calls in the first profiler session (later sessions double, up to MAX_BATCH)."""
    graph_calls: int = 20
    """Calls captured in one CUDA graph in hot mode; per-call time = replay time / graph_calls."""

    @classmethod
    def for_device(cls, device: str, quick: bool = False) -> "TimingOptions":
        """Defaults for a device: DESIGN.md's numbers on GPUs; a few host-clock samples on CPU."""
        if _is_cpu(device):
            # The CPU path exists to run the whole loop without a GPU, not for verdicts:
            # no flush (it would cost more than the call), few samples, ~1.5 s cap per function.
            stop = StopRule(min_samples=3, min_time_s=0.0, target_rel_ci=0.02,
                            max_time_s=0.3 if quick else 1.5, max_samples=20 if quick else 200)
            return cls(cold=False, rounds=2, warmup_s=0.0 if quick else 0.005,
                       warmup_calls=1 if quick else 3, stop=stop)
        if quick:
            stop = StopRule(min_samples=20, min_time_s=0.0, target_rel_ci=0.02,
                            max_time_s=0.5, max_samples=200)
            return cls(rounds=2, stop=stop)
        return cls()


@dataclass
class PairTiming:
    """Candidate (a) against baseline (b) from interleaved ABBA rounds; speedup = time_b / time_a."""

    a: TimingStats
    b: TimingStats
    ratios: list[float]
    speedup: float
    ci: tuple[float, float]


# ---------------------------------------------------------------- pure CUPTI span extraction

def attribute_calls(
    call_ranges: Sequence[tuple[float, float]],
    device_records: Sequence[tuple[str, float, float, Optional[float]]],
) -> list[tuple[str, float, float, int]]:
    """(name, start, end, launch_time) -> (name, start_us, end_us, call_index); -1 when launched outside every call.

    Times in ns, one clock for host and device (kineto aligns them). call_ranges are the host
    ranges of the timed calls, in call order, non-overlapping.
    """
    order = sorted(range(len(call_ranges)), key=lambda i: call_ranges[i][0])
    starts = [call_ranges[i][0] for i in order]
    out = []
    for name, s, e, launch in device_records:
        idx = -1
        if launch is not None:
            j = bisect.bisect_right(starts, launch) - 1
            if j >= 0 and launch <= call_ranges[order[j]][1]:
                idx = order[j]
        out.append((name, s / 1e3, e / 1e3, idx))
    return out


def call_spans(
    records: Sequence[tuple[str, float, float, int]], n_calls: int, exclude: Sequence[str] = ()
) -> list[Optional[float]]:
    """Per call: last end - first start (µs) over its records; None for a call with no record.

    Records named with a prefix in `exclude` (harness kernels) and records of call -1 are ignored.
    """
    lo, hi = [math.inf] * n_calls, [-math.inf] * n_calls
    for name, s, e, i in records:
        if 0 <= i < n_calls and not any(name.startswith(x) for x in exclude):
            lo[i], hi[i] = min(lo[i], s), max(hi[i], e)
    return [h - l if h >= l else None for l, h in zip(lo, hi)]


def kineto_records(events) -> tuple[list[tuple[float, float]], list[tuple[str, float, float, Optional[float]]]]:
    """Split kineto events into the host ranges of the timed calls and device records with launch times."""
    ranges, runtime, ops, dev = [], {}, {}, []
    for e in events:
        on_host = str(e.device_type()).endswith("CPU")
        name = e.name()
        if e.is_user_annotation():
            if on_host and name == CALL_RANGE:
                ranges.append((e.start_ns(), e.end_ns()))
            continue                       # device-side mirrors of the ranges are not work
        if on_host:
            # Runtime/driver calls (cudaLaunchKernel, cuLaunchKernel, cudaMemsetAsync,
            # cudaGraphLaunch) share the device record's correlation id; ops ("ns::op") are what
            # the device record's linked id names, a fallback when the runtime call is missing.
            d = runtime if name.startswith("cu") and "::" not in name else ops
            d[e.correlation_id()] = min(d.get(e.correlation_id(), math.inf), e.start_ns())
        else:
            dev.append((name, e.start_ns(), e.end_ns(), e.correlation_id(), e.linked_correlation_id()))
    # Shift to the first timestamp while still integers: ns since the epoch (~1.8e18) as floats
    # are only exact to 256 ns, which would quantize every span to 0.25 µs.
    t0 = min([r[0] for r in ranges] + [d[1] for d in dev], default=0)
    recs = [(n, s - t0, t - t0, None if (L := runtime.get(c, ops.get(lk))) is None else L - t0)
            for n, s, t, c, lk in dev]
    return sorted((a - t0, b - t0) for a, b in ranges), recs


# ---------------------------------------------------------------- samples and summaries

@dataclass
class Samples:
    """Per-call samples of one function (one round or pooled): device spans and events, kept or low-clock."""

    dev: list[Optional[float]] = field(default_factory=list)
    ev: list[float] = field(default_factory=list)
    low_dev: list[Optional[float]] = field(default_factory=list)
    low_ev: list[float] = field(default_factory=list)
    clocks: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0

    def use_cupti(self, cupti: bool) -> bool:
        """CUPTI spans are used when the profiler works and (almost) every call has records."""
        n = len(self.dev) + len(self.low_dev)
        missing = sum(d is None for d in self.dev + self.low_dev)
        return cupti and n > 0 and missing / n <= MAX_MISSING

    def primary(self, use_dev: bool) -> list[float]:
        """The kept samples the statistics use: CUPTI spans (use_dev) or event / host times."""
        return [d for d in self.dev if d is not None] if use_dev else list(self.ev)

    def values(self, use_dev: bool) -> tuple[list[float], bool]:
        """primary(), or every sample, low-clock ones included, when fewer than 3 were kept (flag True)."""
        ms = self.primary(use_dev)
        if len(ms) >= 3 or not self.low_ev:
            return ms, False
        both = Samples(dev=self.dev + self.low_dev, ev=self.ev + self.low_ev)
        return both.primary(use_dev), True

    def merge(self, other: "Samples") -> "Samples":
        """Pool two sample sets."""
        return Samples(self.dev + other.dev, self.ev + other.ev, self.low_dev + other.low_dev,
                       self.low_ev + other.low_ev, self.clocks + other.clocks,
                       self.elapsed_s + other.elapsed_s)


def summarize(s: Samples, method: str, use_dev: bool, cold: bool, flush: int, scale: float = 1.0) -> TimingStats:
    """TimingStats from samples; `scale` turns per-replay times into per-call times (graphs)."""
    ms, forced = s.values(use_dev)
    x = np.maximum(np.asarray(ms, dtype=float) * scale, _FLOOR_MS)
    q1, med, q3 = np.percentile(x, [25, 50, 75])
    ri = stats.rel_iqr(x)
    ev_med = float(np.median(s.ev)) * scale if s.ev and method != "host" else None
    return TimingStats(
        method=method, median_ms=float(med), q1_ms=float(q1), q3_ms=float(q3), min_ms=float(x.min()),
        n=int(x.size), rel_iqr=ri, ci_rel=stats.ci_rel(x), noisy=stats.noisy(ri) or forced,
        cold=cold, flush_bytes=flush, mean_clock_mhz=float(np.mean(s.clocks)) if s.clocks else None,
        dropped_low_clock=0 if forced else len(s.low_ev), events_median_ms=ev_med, total_s=s.elapsed_s,
    )


# ---------------------------------------------------------------- host clock (CPU)

def _warmup(fn, opts: TimingOptions, before=None, after=None) -> None:
    """Call fn until both warmup_calls and warmup_s are reached (after the caller's compile call)."""
    t0, n = _clock(), 0
    while n < opts.warmup_calls or _clock() - t0 < opts.warmup_s:
        before and before()
        fn()
        after and after()
        n += 1


class _HostTimer:
    """perf_counter_ns around each call."""

    cupti, cold, flush, scale = False, False, 0, 1.0

    def __init__(self, opts: TimingOptions):
        self.opts = opts

    def method(self, use_dev: bool) -> str:
        return "host"

    def prepare(self, fn: Callable[[], object]) -> Callable[[], object]:
        _warmup(fn, self.opts)
        return fn

    def sample(self, fn: Callable[[], object], rule: StopRule) -> Samples:
        s, t0, check = Samples(), _clock(), 1
        while True:
            a = _clock_ns()
            fn()
            s.ev.append((_clock_ns() - a) / 1e6)
            # The CI costs O(n); check on a geometric schedule so the loop stays O(n log n).
            if len(s.ev) >= check:
                check = len(s.ev) + max(1, len(s.ev) // 10)
                if rule.should_stop(s.ev, _clock() - t0):
                    break
        s.elapsed_s = _clock() - t0
        return s


# ---------------------------------------------------------------- CUDA

class _Clock:
    """SM clock through NVML (optional); never changes clocks, only reads them."""

    def __init__(self, torch, index: int):
        self.nvml, self.h, self.ref = None, None, None
        try:
            import pynvml as nv

            nv.nvmlInit()
            p = torch.cuda.get_device_properties(index)
            try:
                bus = f"{p.pci_domain_id:08X}:{p.pci_bus_id:02X}:{p.pci_device_id:02X}.0"
                self.h = nv.nvmlDeviceGetHandleByPciBusId(bus)
            except Exception:
                self.h = nv.nvmlDeviceGetHandleByIndex(index)
            try:
                self.ref = nv.nvmlDeviceGetDefaultApplicationsClock(self.h, nv.NVML_CLOCK_SM)
            except Exception:
                self.ref = nv.nvmlDeviceGetMaxClockInfo(self.h, nv.NVML_CLOCK_SM)
            self.nvml = nv
        except Exception:                      # no pynvml, no NVML (MACA), or no permission
            self.nvml = None

    def read(self) -> Optional[float]:
        try:
            return float(self.nvml.nvmlDeviceGetClockInfo(self.h, self.nvml.NVML_CLOCK_SM)) if self.nvml else None
        except Exception:
            return None

    def low(self, mhz: Optional[float]) -> bool:
        return bool(mhz is not None and self.ref and mhz < LOW_CLOCK_FRAC * self.ref)


_CUPTI_OK: dict[str, bool] = {}


class _CudaTimer:
    """Cold (flushed) or hot timing of callables on one CUDA device."""

    def __init__(self, device: str, opts: TimingOptions):
        import torch

        from kopt import hardware

        self.torch, self.opts = torch, opts
        self.dev = torch.device(device)
        index = self.dev.index if self.dev.index is not None else torch.cuda.current_device()
        self.cold = opts.cold and not opts.graph
        self.flush = hardware.flush_bytes(hardware.detect(device)) if self.cold else 0
        with torch.cuda.device(index):
            self.buf = torch.empty(self.flush, dtype=torch.uint8, device=self.dev) if self.cold else None
        self.clock = _Clock(torch, index)
        self.scale = 1.0 / opts.graph_calls if opts.graph else 1.0
        if device not in _CUPTI_OK:          # once per process: CUPTI's start-up, ~5 s on an H200
            _CUPTI_OK[device] = self._probe_cupti()
        self.cupti = _CUPTI_OK[device]

    def method(self, use_dev: bool) -> str:
        return "graph" if self.opts.graph else ("cupti" if use_dev else "events")

    def _profiler(self):
        from torch.profiler import ProfilerActivity, profile

        return profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])

    def _probe_cupti(self) -> bool:
        try:
            x = self.torch.zeros(1, device=self.dev)
            spans, _, _ = self._batch(lambda: x.add_(1), 2, cupti=True)
            return all(s is not None for s in spans)
        except Exception:                      # no kineto / CUPTI in this build
            return False

    def _batch(self, fn, n: int, cupti: bool):
        torch, rf = self.torch, self.torch.profiler.record_function
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        prof = self._profiler() if cupti else nullcontext()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")    # kineto's per-cycle notices
            with prof:
                for i in range(n):
                    if self.buf is not None:
                        with rf(FLUSH_RANGE):
                            self.buf.zero_()
                    starts[i].record()
                    with rf(CALL_RANGE):
                        fn()
                    ends[i].record()
                mhz = self.clock.read()        # read while the queued batch keeps the GPU busy
                torch.cuda.synchronize(self.dev)
        ev = [a.elapsed_time(b) for a, b in zip(starts, ends)]
        if not cupti:
            return [None] * n, ev, mhz
        ranges, recs = kineto_records(prof.profiler.kineto_results.events())
        if len(ranges) != n:                   # ranges lost: attribution would be guesswork
            return [None] * n, ev, mhz
        spans = call_spans(attribute_calls(ranges, recs), n)
        return [None if s is None else s / 1e3 for s in spans], ev, mhz

    def prepare(self, fn: Callable[[], object]) -> Callable[[], object]:
        torch = self.torch
        # Synchronize each call so the warm-up time is device time, not queued launches.
        _warmup(fn, self.opts, before=self.buf.zero_ if self.buf is not None else None,
                after=lambda: torch.cuda.synchronize(self.dev))
        if not self.opts.graph:
            return fn
        g, side = torch.cuda.CUDAGraph(), torch.cuda.Stream(self.dev)
        side.wait_stream(torch.cuda.current_stream(self.dev))
        with torch.cuda.stream(side):          # capture wants its first calls on a side stream
            for _ in range(3):
                fn()
        torch.cuda.current_stream(self.dev).wait_stream(side)
        with torch.cuda.graph(g):
            for _ in range(self.opts.graph_calls):
                fn()
        g.replay()
        torch.cuda.synchronize(self.dev)
        return g.replay

    def sample(self, fn: Callable[[], object], rule: StopRule) -> Samples:
        s, t0, size = Samples(), _clock(), max(1, self.opts.batch)
        while True:
            n = max(1, min(size, rule.max_samples - len(s.dev)))
            dev, ev, mhz = self._batch(fn, n, self.cupti)
            if mhz is not None:
                s.clocks.append(mhz)
            if self.clock.low(mhz):
                s.low_dev += dev
                s.low_ev += ev
            else:
                s.dev += dev
                s.ev += ev
            size = min(MAX_BATCH, size * 2)
            el = _clock() - t0
            if rule.should_stop(s.primary(s.use_cupti(self.cupti)), el) or \
                    rule.capped(len(s.dev) + len(s.low_dev), el):
                break
        s.elapsed_s = _clock() - t0
        return s


# ---------------------------------------------------------------- public API

def _timer(device: str, opts: TimingOptions):
    return _HostTimer(opts) if _is_cpu(device) else _CudaTimer(device, opts)


def time_fn(fn: Callable[[], object], device: str, opts: TimingOptions) -> TimingStats:
    """Time one callable (already called once by the caller, for compilation) on a device."""
    t = _timer(device, opts)
    s = t.sample(t.prepare(fn), opts.stop)
    use_dev = s.use_cupti(t.cupti)
    return summarize(s, t.method(use_dev), use_dev, t.cold, t.flush, t.scale)


def time_pair(fn_a: Callable[[], object], fn_b: Callable[[], object], device: str,
              opts: TimingOptions) -> PairTiming:
    """Interleaved ABBA rounds of candidate a and baseline b; speedup = median per-round time_b / time_a."""
    t = _timer(device, opts)
    ha, hb = t.prepare(fn_a), t.prepare(fn_b)
    rounds = max(1, opts.rounds)
    rule = opts.stop.split(rounds)
    ra: list[Samples] = []
    rb: list[Samples] = []
    for r in range(rounds):                    # A B, B A, A B, ...: drifts hit both sides alike
        for h, acc in ((ha, ra), (hb, rb)) if r % 2 == 0 else ((hb, rb), (ha, ra)):
            acc.append(t.sample(h, rule))
    # One method for every round: if CUPTI failed in any round, all rounds use events.
    use_dev = all(x.use_cupti(t.cupti) for x in ra + rb)
    ps = stats.paired_speedup([x.values(use_dev)[0] for x in ra], [x.values(use_dev)[0] for x in rb])
    pa, pb = reduce(Samples.merge, ra, Samples()), reduce(Samples.merge, rb, Samples())
    return PairTiming(
        a=summarize(pa, t.method(use_dev), use_dev, t.cold, t.flush, t.scale),
        b=summarize(pb, t.method(use_dev), use_dev, t.cold, t.flush, t.scale),
        ratios=ps.ratios, speedup=ps.speedup, ci=ps.ci,
    )
