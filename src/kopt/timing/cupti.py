"""CUPTI spans from kineto: profiler sessions, kernel records attributed to timed calls, the probe.

Kernels are attributed to a timed call by the host launch that started them (the runtime call's
timestamp inside the call's `kopt::call` range); a call's time is its first kernel start to its last
kernel end. Pure functions over (name, start, end, launch) tuples, unit-tested without a GPU, plus
the session classes the CUDA timer opens.
"""

from __future__ import annotations

import bisect
import math
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Optional

from kopt.timing.options import CALL_RANGE

# ---------------------------------------------------------------- pure CUPTI span extraction

def attribute_calls(
    call_ranges: Sequence[tuple[float, float]],
    device_records: Sequence[tuple[str, float, float, Optional[float]]],
) -> list[tuple[str, float, float, int]]:
    """(name, start, end, launch_time) -> (name, start_us, end_us, call_index); -1 when launched outside every call.

    Times in ns, one clock for host and device (kineto aligns them). call_ranges are the host
    ranges of the timed calls, in call order, non-overlapping.
    """
    calls = call_indices(call_ranges, [r[3] for r in device_records])
    return [(name, s / 1e3, e / 1e3, i) for (name, s, e, _), i in zip(device_records, calls)]


def call_indices(call_ranges: Sequence[tuple[float, float]], launches: Sequence[Optional[float]]) -> list[int]:
    """Per launch time: the index of the call range holding it, -1 when none does (attribute_calls' rule)."""
    order = sorted(range(len(call_ranges)), key=lambda i: call_ranges[i][0])
    starts = [call_ranges[i][0] for i in order]
    out = []
    for launch in launches:
        idx = -1
        if launch is not None:
            j = bisect.bisect_right(starts, launch) - 1
            if j >= 0 and launch <= call_ranges[order[j]][1]:
                idx = order[j]
        out.append(idx)
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
    return [b - a if b >= a else None for a, b in zip(lo, hi)]


#: Host runtime calls after which the caller's stream (or the host) waits for other work: a side stream
#: joined by one of these before `run` returns is ordered with the caller's stream.
JOIN_CALLS = ("cudaStreamWaitEvent", "cuStreamWaitEvent", "cudaStreamSynchronize", "cuStreamSynchronize",
              "cudaDeviceSynchronize", "cuCtxSynchronize", "cudaEventSynchronize", "cuEventSynchronize")


@dataclass
class DeviceRecord:
    """One device activity of a profiler session (ns, shifted to the session's first timestamp)."""

    name: str
    start: float
    end: float
    launch: Optional[float]
    """Host time of the runtime call that launched it (None when kineto kept none)."""
    stream: Optional[int] = None


@dataclass
class Trace:
    """What the timer reads from one profiler session."""

    ranges: list[tuple[float, float]]
    """Host ranges of the timed calls, in order."""
    records: list[DeviceRecord]
    joins: list[float]
    """Host times of stream waits and synchronizations (JOIN_CALLS)."""
    call_of: list[int] = field(init=False)
    """Per record, the index of the call whose range launched it (-1: the harness's own), attributed once."""

    def __post_init__(self):
        self.call_of = call_indices(self.ranges, [r.launch for r in self.records])

    def by_call(self, n: int) -> list[list[DeviceRecord]]:
        """Per call 0..n-1: the device records it launched, in start order."""
        per: list[list[DeviceRecord]] = [[] for _ in range(n)]
        for r, i in zip(self.records, self.call_of):
            if 0 <= i < n:
                per[i].append(r)
        for recs in per:
            recs.sort(key=lambda r: r.start)
        return per


@dataclass
class CallFacts:
    """One timed call as the device saw it."""

    span_us: Optional[float]
    """First start to last end of its device activities (None: no record)."""
    host_bound: bool = False
    """A kernel of the call was launched only after the call's previous kernel had ended: the GPU waited
    for the host inside the span, so the span is not device time alone."""
    side_stream: bool = False
    """It ran work on a stream other than the caller's and did not join it before returning."""


def call_facts(tr: Trace, n: int, main_stream: Optional[int], lead: Optional[Sequence[int]] = None) -> list[CallFacts]:
    """Per call: its span, whether the host was inside it, whether it left work on another stream.

    A call's records are those launched inside its range (attribute_calls). main_stream is the stream
    the harness launched its own work on (flush, hold); None skips the side-stream test. lead[i]: the
    harness's own records that open call i's range (the flush inside a replayed graph of [flush, call]:
    they run first, and are dropped by their place, never by name)."""
    joins = sorted(tr.joins)
    out = []
    for i, recs in enumerate(tr.by_call(n)):
        if lead:
            recs = recs[lead[i]:]
        if not recs:
            out.append(CallFacts(None))
            continue
        # The GPU waited for the host when a launch came after everything before it on the device ended.
        bound, done = False, recs[0].end
        for r in recs[1:]:
            bound = bound or (r.launch is not None and r.launch > done)
            done = max(done, r.end)
        span = (done - recs[0].start) / 1e3  # done: the last end
        side = False
        if main_stream is not None:
            off = [r.launch for r in recs if r.stream is not None and r.stream != main_stream]
            if off:
                last = max((t for t in off if t is not None), default=tr.ranges[i][0])
                j = bisect.bisect_right(joins, last)
                side = not (j < len(joins) and joins[j] <= tr.ranges[i][1])
        out.append(CallFacts(span, bound, side))
    return out


def call_names(tr: Trace, n: int) -> list[Counter]:
    """Per call: the names of the device activities it launched, with their counts. A memset or memcpy
    is named by its kind alone: kineto adds the memory kind, which one capture of the same memset reads
    as "(Device)" and another as "(Unknown)" on an H200."""
    out: list[Counter] = [Counter() for _ in range(n)]
    for r, i in zip(tr.records, tr.call_of):
        if 0 <= i < n:
            name = r.name.split(" (")[0] if r.name.startswith(("Memset", "Memcpy")) else r.name
            out[i][name] += 1
    return out


def main_stream_of(tr: Trace) -> Optional[int]:
    """The stream of the harness's own launches (records launched outside every call range)."""
    mine = Counter(r.stream for r, i in zip(tr.records, tr.call_of) if i == -1 and r.stream is not None)
    return mine.most_common(1)[0][0] if mine else None


def facts_of(events, n: int, lead: Optional[Sequence[int]] = None) -> Optional[list[CallFacts]]:
    """CallFacts of the n ranged calls of a profiler session, or None when the session did not keep n
    ranges (attribution would be guesswork). lead: as call_facts."""
    tr = kineto_trace(events)
    if len(tr.ranges) != n:
        return None
    return call_facts(tr, n, main_stream_of(tr), lead)


def kineto_records(events) -> tuple[list[tuple[float, float]], list[tuple[str, float, float, Optional[float]]]]:
    """Split kineto events into the host ranges of the timed calls and device records with launch times."""
    tr = kineto_trace(events)
    return tr.ranges, [(r.name, r.start, r.end, r.launch) for r in tr.records]


def kineto_trace(events) -> Trace:
    """Host ranges of the timed calls, device records (launch time, stream) and the host's joins."""
    ranges, runtime, ops, dev, joins = [], {}, {}, [], []
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
            runtime_call = name.startswith("cu") and "::" not in name
            d = runtime if runtime_call else ops
            c, t = e.correlation_id(), e.start_ns()
            if t < d.get(c, math.inf):
                d[c] = t
            if runtime_call and name in JOIN_CALLS:
                joins.append(t)
        else:
            stream = getattr(e, "device_resource_id", None)
            dev.append((name, e.start_ns(), e.end_ns(), e.correlation_id(), e.linked_correlation_id(),
                        stream() if callable(stream) else None))
    # Shift to the first timestamp while still integers: ns since the epoch (~1.8e18) as floats
    # are only exact to 256 ns, which would quantize every span to 0.25 µs.
    t0 = min([r[0] for r in ranges] + [d[1] for d in dev], default=0)
    recs = [DeviceRecord(n, s - t0, t - t0, None if (L := runtime.get(c, ops.get(lk))) is None else L - t0, st)
            for n, s, t, c, lk, st in dev]
    return Trace(sorted((a - t0, b - t0) for a, b in ranges), recs, [j - t0 for j in joins])


_CUPTI_OK: dict[str, bool] = {}
#: Seconds the first CUPTI session of this process took to start, per device (reported in overhead_s).
CUPTI_START_S: dict[str, float] = {}


class _Session:
    """One kineto session (CPU + CUDA activities) that records only user-scope ranges on the host.

    Without the scope filter every aten op inside a call (flash-attn's wrapper runs dozens) is a
    host event, recorded at launch and read back afterwards: on an H200 a case-10 sample cost ~500 µs
    of host time (~420 µs with the filter), and the first session of a process 4.4-6.1 s (0.03-0.3 s
    with it). Device records and runtime launches, which the spans need, are unaffected.
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


def profiler():
    try:
        return _Session()
    except (ImportError, AttributeError, TypeError):
        return _Profile()


def _probe(device: str) -> None:
    """One short profiler session: does CUPTI give a device record for each of two ranged calls?
    The first session of a process pays CUPTI's start-up (0.03-0.3 s on an H200 with user-scope
    sessions, 4-6 s with every op recorded), so it is done once. (Started early in a thread, the
    4-6 s kind did not overlap the candidate's import: the session holds the GIL, and the child's
    compile phase grew by its length.)"""
    import torch

    t0 = time.perf_counter()
    ok = False
    try:
        dev = torch.device(device)
        x = torch.zeros(1, device=dev)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with profiler() as prof:
                for _ in range(2):
                    with torch.profiler.record_function(CALL_RANGE):
                        x.add_(1)
                torch.cuda.synchronize(dev)
        got = facts_of(prof.events(), 2)
        ok = got is not None and all(f.span_us is not None for f in got)
    except Exception:                          # no kineto / CUPTI in this build
        ok = False
    CUPTI_START_S[device] = time.perf_counter() - t0
    _CUPTI_OK[device] = ok


def cupti_ok(device: str) -> bool:
    """Whether CUPTI spans work here (probed once per process and device)."""
    if device not in _CUPTI_OK:
        _probe(device)
    return _CUPTI_OK[device]
