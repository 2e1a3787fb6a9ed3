"""CUDA timing: CUPTI kernel spans per call (kineto), the L2 flush, graph replay and the NVML clock guard.

Kernels are attributed to a timed call by the host launch that started them; a call's time is its first
kernel start to its last kernel end, so a split kernel and its combine both count and flush kernels,
launched outside every call range, never do.
"""

from __future__ import annotations

import bisect
import math
import time
import warnings
from contextlib import nullcontext
from typing import Callable, Optional, Sequence

from kopt.stats import StopRule
from kopt.timing import CALL_RANGE, LOW_CLOCK_FRAC, MAX_BATCH, Samples, TimingOptions, _clock, _warmup


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
    host_type: dict = {}                   # device_type() value -> on the host? (str() once per value)
    for e in events:
        dt = e.device_type()
        on_host = host_type.get(dt)
        if on_host is None:
            on_host = host_type[dt] = str(dt).endswith("CPU")
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
            c, t = e.correlation_id(), e.start_ns()
            if t < d.get(c, math.inf):
                d[c] = t
        else:
            dev.append((name, e.start_ns(), e.end_ns(), e.correlation_id(), e.linked_correlation_id()))
    # Shift to the first timestamp while still integers: ns since the epoch (~1.8e18) as floats
    # are only exact to 256 ns, which would quantize every span to 0.25 µs.
    t0 = min([r[0] for r in ranges] + [d[1] for d in dev], default=0)
    recs = [(n, s - t0, t - t0, None if (L := runtime.get(c, ops.get(lk))) is None else L - t0)
            for n, s, t, c, lk in dev]
    return sorted((a - t0, b - t0) for a, b in ranges), recs


# ---------------------------------------------------------------- samples and summaries

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
#: Seconds the first CUPTI session of this process took to start, per device (reported in overhead_s).
CUPTI_START_S: dict[str, float] = {}
#: With CUPTI, one call in this many is also bracketed by CUDA events (the cross-check).
EVENT_EVERY = 8
#: Host seconds of the timing loop by part (launching, waiting for the device, reading CUPTI records).
PHASE_S: dict[str, float] = {"launch": 0.0, "wait": 0.0, "records": 0.0, "sessions": 0.0}


class _Session:
    """One kineto session (CPU + CUDA activities) that records only user-scope ranges on the host.

    Without the scope filter every aten op inside a call (flash-attn's wrapper runs dozens) is a
    host event: recorded at launch and read back afterwards, ~400 µs of host time per sample
    measured on an H200. Device records and runtime launches, which the spans need, are unaffected.
    """

    def __init__(self):
        from torch._C._profiler import RecordScope, _ExperimentalConfig
        from torch.autograd import ProfilerActivity, ProfilerConfig, ProfilerState

        self.acts = {ProfilerActivity.CPU, ProfilerActivity.CUDA}
        self.cfg = ProfilerConfig(ProfilerState.KINETO, False, False, False, False, False, _ExperimentalConfig())
        self.scopes = {RecordScope.USER_SCOPE}
        self.result = None

    def __enter__(self):
        from torch.autograd import _enable_profiler, _prepare_profiler

        _prepare_profiler(self.cfg, self.acts)
        _enable_profiler(self.cfg, self.acts, self.scopes)
        return self

    def __exit__(self, *exc):
        from torch.autograd import _disable_profiler

        self.result = _disable_profiler()
        return False

    def events(self):
        return self.result.events()


class _Profile:
    """torch.profiler.profile, for torch builds without the low-level calls (every op recorded)."""

    def __init__(self):
        from torch.profiler import ProfilerActivity, profile

        self.prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])

    def __enter__(self):
        self.prof.__enter__()
        return self

    def __exit__(self, *exc):
        return self.prof.__exit__(*exc)

    def events(self):
        return self.prof.profiler.kineto_results.events()


def _profiler():
    try:
        return _Session()
    except (ImportError, AttributeError, TypeError):
        return _Profile()


def _probe(device: str) -> None:
    """One short profiler session: does CUPTI give a device record for each of two ranged calls?
    The first session of a process pays CUPTI's start-up (4-6 s on an H200), so it is done once.
    (Started early in a thread, it did not overlap the candidate's import on the H200: the session
    holds the GIL, and that child's compile phase grew by its length.)"""
    import torch

    t0 = time.perf_counter()
    ok = False
    try:
        dev = torch.device(device)
        x = torch.zeros(1, device=dev)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with _profiler() as prof:
                for _ in range(2):
                    with torch.profiler.record_function(CALL_RANGE):
                        x.add_(1)
                torch.cuda.synchronize(dev)
        ranges, recs = kineto_records(prof.events())
        ok = len(ranges) == 2 and all(s is not None for s in call_spans(attribute_calls(ranges, recs), 2))
    except Exception:                          # no kineto / CUPTI in this build
        ok = False
    CUPTI_START_S[device] = time.perf_counter() - t0
    _CUPTI_OK[device] = ok


def _cupti_ok(device: str) -> bool:
    """Whether CUPTI spans work here (probed once per process and device)."""
    if device not in _CUPTI_OK:
        _probe(device)
    return _CUPTI_OK[device]


class CudaTimer:
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
        self.cupti = _cupti_ok(device)         # once per process: CUPTI's start-up, ~5 s on an H200
        self._events: list = []
        self._call_ms: dict[int, float] = {}

    def method(self, use_dev: bool) -> str:
        return "graph" if self.opts.graph else ("cupti" if use_dev else "events")

    def _profiler(self):
        return _profiler()

    def _event_pairs(self, n: int) -> list:
        """n (start, end) CUDA event pairs, created once and reused (each batch synchronizes before reuse)."""
        Event = self.torch.cuda.Event
        while len(self._events) < n:
            self._events.append((Event(enable_timing=True), Event(enable_timing=True)))
        return self._events[:n]

    def _batch(self, fn, n: int, cupti: bool):
        """n flushed calls: (CUPTI span per call or None, event times, SM clock). With CUPTI the event
        cross-check brackets every EVENT_EVERY-th call only (two records and a readback cost ~65 µs
        of host time a call on an H200); without it every call, as events are then the samples."""
        torch, rf = self.torch, self.torch.profiler.record_function
        every = EVENT_EVERY if cupti else 1
        pairs = self._event_pairs(-(-n // every))
        prof = self._profiler() if cupti else nullcontext()
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")    # kineto's per-cycle notices
            with prof:
                t1 = time.perf_counter()
                # The flush runs outside every call range: its kernels are never attributed to a call.
                for i in range(n):
                    if self.buf is not None:
                        self.buf.zero_()
                    if i % every:
                        with rf(CALL_RANGE):
                            fn()
                        continue
                    a, b = pairs[i // every]
                    a.record()
                    with rf(CALL_RANGE):
                        fn()
                    b.record()
                mhz = self.clock.read()        # read while the queued batch keeps the GPU busy
                t2 = time.perf_counter()
                torch.cuda.synchronize(self.dev)
                t3 = time.perf_counter()
        ev = [a.elapsed_time(b) for a, b in pairs]
        t4 = time.perf_counter()
        PHASE_S["launch"] += t2 - t1
        PHASE_S["wait"] += t3 - t2
        PHASE_S["sessions"] += (t1 - t0) + (t4 - t3)
        if not cupti:
            return [None] * n, ev, mhz
        ranges, recs = kineto_records(prof.events())
        PHASE_S["records"] += time.perf_counter() - t4
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
            self._estimate(fn)
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

    def _estimate(self, fn) -> None:
        """One event-timed call (events over-read: the estimate errs long, so batches sized from it
        never overshoot the stopping rule's minimum time)."""
        (a, b), = self._event_pairs(1)
        if self.buf is not None:
            self.buf.zero_()
        a.record()
        fn()
        b.record()
        self.torch.cuda.synchronize(self.dev)
        self._call_ms[id(fn)] = max(a.elapsed_time(b), 1e-3)

    def _first_batch(self, fn, rule: StopRule) -> int:
        """Calls in the first profiler session: what the rule's minimum time asks for, so a short
        call takes one session per round instead of several (a session costs ~10 ms of host time)."""
        ms = self._call_ms.get(id(fn))
        want = math.ceil(rule.min_time_s * 1e3 / ms) if ms else 0
        if want * 2 >= rule.max_samples:   # the sample cap will decide: all of it in one session
            want = rule.max_samples
        return max(1, self.opts.batch, min(MAX_BATCH, rule.max_samples, want))

    def sample(self, fn: Callable[[], object], rule: StopRule) -> Samples:
        s, t0, size = Samples(), _clock(), self._first_batch(fn, rule)
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


