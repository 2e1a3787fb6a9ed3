"""CUDA timing: the timer (L2 flush, sessions of flushed calls, graph replay) and the NVML clock guard.

The cold flush is max(2 x L2, 256 MiB) of a zeroed buffer before each call, outside every call range.
By default it is read ("read"): the inputs leave L2 and L2 is left holding clean lines. Zeroing it
instead ("zero", nvbench's and Triton's way) leaves L2 full of dirty lines that the timed call must write
back as its reads evict them: on an H200 that added 7-9 µs to every call reading more than L2's 60 MB
(the candidate, FA2 and a plain read of K and V alike; results/flush-study-H200.md), a cost of the
harness, not of the kernel.

Per-call device time comes from CUPTI spans (kopt.timing.cupti): a call's time is its first kernel start to
its last kernel end, so a split kernel and its combine both count and flush kernels, launched outside
every call range, never do.

Device-only calls replay a CUDA graph of [flush, call] captured from each call (replay "graph"): one graph
launch per call, so the call's kernels follow the flush and each other as a serving engine's decode graph
runs them; the flush's records, first in the replay, are dropped from the span by their count. Launched one
by one on a stream (replay "stream"), the device still starts a call's second kernel ~0.7 µs after the
first ends on an H200 even with the host far ahead (FA2's split + combine on case 5: 10.4 µs on the stream,
9.6 µs replayed). A graph is used only when every timed function captures, its replay launches the call's
kernels and the flush's, and it writes the call's output; otherwise both sides run on the stream and
`replay_note` says why.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from typing import Optional

from kopt.timing.cupti import call_names, cupti_ok, facts_of, kineto_trace, profiler
from kopt.timing.options import (
    CALL_RANGE,
    LOW_CLOCK_FRAC,
    MAX_BATCH,
    Rotation,
    Samples,
    TimingOptions,
    clock,
    warmup,
)
from kopt.timing.stats import StopRule


def make_flush(buf, kind: str) -> Callable[[], object]:
    """The flush of a zeroed uint8 buffer: "zero" writes it again, "read" reads it (a float32 sum
    into a preallocated 1-element tensor: no allocation per call). Any device (unit-tested on CPU)."""
    import torch

    if kind == "zero":
        return buf.zero_
    words = buf[: buf.numel() // 4 * 4].view(torch.float32)
    sink = torch.zeros(1, dtype=torch.float32, device=buf.device)
    return lambda: torch.sum(words, dim=0, keepdim=True, out=sink)


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


#: With CUPTI, one call in this many is also bracketed by CUDA events (the cross-check).
EVENT_EVERY = 8
#: The hold before a device-only batch lasts while the host enqueues this many calls (at twice the
#: host's measured pace), within [HOLD_MIN_US, HOLD_MAX_US]: after it the flushes (~60 µs of device time
#: each, more than a call's launches cost the host) keep the device behind the host.
HOLD_CALLS = 16
HOLD_MIN_US, HOLD_MAX_US = 100.0, 20_000.0
#: A graph replay's output must match the call's elementwise within |a - b| <= ATOL + RTOL * |b| (the same
#: kernels on the same inputs: equal in practice; the margin admits kernels that merge with atomics).
GRAPH_ATOL, GRAPH_RTOL = 2e-3, 2e-2
#: Host seconds of the timing loop by part (launching, waiting for the device, reading CUPTI records).
PHASE_S: dict[str, float] = {"launch": 0.0, "wait": 0.0, "records": 0.0, "sessions": 0.0}


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
        self.flush_kind = opts.flush if self.cold else None
        self._flush = None
        if self.cold:  # the flush closure keeps its buffer alive
            with torch.cuda.device(index):
                buf = torch.zeros(self.flush, dtype=torch.uint8, device=self.dev)
            self._flush = make_flush(buf, opts.flush)
        self.clock = _Clock(torch, index)
        self.scale = 1.0 / opts.graph_calls if opts.graph else 1.0
        self.cupti = cupti_ok(device)         # probed once per process (CUPTI's start-up)
        self._events: list = []
        self.replay: Optional[str] = None
        """How the device-only calls ran ("graph" | "stream"); None until prepared, and when not device-only."""
        self.replay_note = ""
        """Why "graph" was asked for and not used."""
        self._eager_of: dict[int, Callable[[], object]] = {}
        """Graph replay handle -> the call it was captured from (the eager figure runs the call itself)."""
        self._flush_records = 0
        """Device records of the flush as a graph replays it (the first records of every replayed call)."""
        self._flush_graph = None
        """The flush alone as a graph (the capture check counts its records)."""
        self._call_ms: dict[int, float] = {}
        self._host_us: dict[int, float] = {}
        """Host µs to enqueue one flushed call of each function (measured on its last batch)."""

    def method(self, use_dev: bool) -> str:
        return "graph" if self.opts.graph else ("cupti" if use_dev else "events")

    def _profiler(self):
        return profiler()

    def _event_pairs(self, n: int) -> list:
        """n (start, end) CUDA event pairs, created once and reused (each batch synchronizes before reuse)."""
        Event = self.torch.cuda.Event
        while len(self._events) < n:
            self._events.append((Event(enable_timing=True), Event(enable_timing=True)))
        return self._events[:n]

    def _batch(self, fn, n: int, cupti: bool):
        """n flushed calls: (CUPTI facts per call or None, event times, SM clock)."""
        return self._batches([(fn, n, False)], cupti)[0]

    def _hold(self, calls: int, fn) -> None:
        """Hold the stream with a spin kernel for as long as the host takes to enqueue `calls` flushed
        calls of fn (nvbench's blocking kernel, bounded by time): the calls that follow start only once
        the host is far ahead, so no kernel of a timed call waits for its launch. Launched outside every
        call range, so no span contains it."""
        host_us = self._host_us.get(id(fn), 50.0)
        us = min(HOLD_MAX_US, max(HOLD_MIN_US, 2.0 * calls * host_us))
        self.torch.cuda._sleep(int(us * (self.clock.ref or 2000)))

    def _batches(self, segments: list, cupti: bool) -> list:
        """Segments of flushed calls, (fn, n, eager) each, in one profiler session: per segment (CallFacts
        per call or None, event times, SM clock read at the segment's end).

        A device-only segment (eager False) starts behind a hold (_hold) and its calls are enqueued
        back to back; an eager segment synchronizes after each flush, so every call starts on an idle GPU
        and its span holds the host's launches (the host-inclusive figure). With CUPTI the event
        cross-check brackets every EVENT_EVERY-th call only (two records and a readback cost ~65 µs of
        host time a call on an H200); without it every call, as events are then the samples. A graph
        replay (a handle of _capture) holds its own flush, first: no flush is launched before it, its flush's
        records are dropped from its span by their place, and no events bracket it (they would hold the flush)."""
        torch, rf = self.torch, self.torch.profiler.record_function
        every = EVENT_EVERY if cupti else 1
        graph = [id(fn) in self._eager_of for fn, _, _ in segments]
        counts = [0 if g else -(-n // every) for (_, n, _), g in zip(segments, graph)]
        pairs = self._event_pairs(sum(counts))
        prof = self._profiler() if cupti else nullcontext()
        clocks, first = [], 0
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")    # kineto's per-cycle notices
            with prof:
                t1 = time.perf_counter()
                # The flush runs outside every call range (its kernels are never attributed to a call),
                # or first in a replayed graph.
                for (fn, n, eager), k, g in zip(segments, counts, graph):
                    seg = pairs[first:first + k]
                    first += k
                    if not eager and cupti:
                        self._hold(min(n, HOLD_CALLS), fn)
                    ts = time.perf_counter()
                    for i in range(n):
                        if self._flush is not None and not g:
                            self._flush()
                        if eager:
                            torch.cuda.synchronize(self.dev)
                        bracket = i % every == 0 and not g
                        if bracket:
                            seg[i // every][0].record()
                        with rf(CALL_RANGE):
                            fn()
                        if bracket:
                            seg[i // every][1].record()
                    if not eager:
                        self._host_us[id(fn)] = (time.perf_counter() - ts) * 1e6 / max(n, 1)
                    clocks.append(self.clock.read())  # read while the queued calls keep the GPU busy
                t2 = time.perf_counter()
                torch.cuda.synchronize(self.dev)
                t3 = time.perf_counter()
        ev_all = [a.elapsed_time(b) for a, b in pairs[:first]]
        t4 = time.perf_counter()
        PHASE_S["launch"] += t2 - t1
        PHASE_S["wait"] += t3 - t2
        PHASE_S["sessions"] += (t1 - t0) + (t4 - t3)
        evs, first = [], 0
        for k in counts:
            evs.append(ev_all[first:first + k])
            first += k
        total = sum(n for _, n, _ in segments)
        facts: list = [None] * total
        if cupti:
            lead = [self._flush_records if g else 0 for (_, n, _), g in zip(segments, graph) for _ in range(n)]
            got = facts_of(prof.events(), total, lead)
            PHASE_S["records"] += time.perf_counter() - t4
            if got is not None:
                facts = got
        out, first = [], 0
        for (_, n, _), ev, mhz in zip(segments, evs, clocks):
            out.append((facts[first:first + n], ev, mhz))
            first += n
        return out

    def prepare(self, fn: Callable[[], object]) -> Callable[[], object]:
        return self.prepare_all([fn])[0]

    def prepare_all(self, fns: list, labels: tuple[str, ...] = ()) -> list:
        """Warm each function up and return what the timer calls: graph replays of each (cold, with CUPTI,
        replay "graph") when all of them capture, else the functions themselves; hot mode: its graphs."""
        torch = self.torch
        for fn in fns:  # synchronize each call so the warm-up time is device time, not queued launches
            warmup(fn, self.opts, before=self._flush, after=lambda: torch.cuda.synchronize(self.dev))
        if self.opts.graph:
            return [self._hot_graph(fn) for fn in fns]
        handles = list(fns)
        for fn in fns:
            self._estimate(fn)
        if self.cold and self.cupti:
            self.replay, self.replay_note = "stream", ""
            if self.opts.replay == "graph":
                got = []
                for i, fn in enumerate(fns):
                    h, why = self._capture(fn)
                    if h is None:
                        self.replay_note = f"{labels[i]}: {why}" if i < len(labels) and len(fns) > 1 else why
                        break
                    got.append(h)
                else:
                    handles, self.replay = got, "graph"
                    for h, fn in zip(got, fns):
                        self._adopt(h, fn, fn)
        return handles

    def _adopt(self, h, fn, like) -> None:
        """Graph handle h replays fn's calls: the eager figure runs fn itself, and h takes the per-function
        estimates (call time, host time a call) of `like`, fn or the handle h replaces."""
        self._eager_of[id(h)] = fn
        for d in (self._call_ms, self._host_us):
            if id(like) in d:
                d[id(h)] = d[id(like)]

    def _hot_graph(self, fn):
        """Hot mode: graph_calls calls in one graph, replayed (no flush; per-call time = replay / graph_calls)."""
        torch = self.torch
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

    def _capture(self, fn) -> tuple[Optional[Rotation], str]:
        """A graph of [flush, call] for each of fn's calls (each input set of a Rotation), replayed in the
        same rotation, or None and why not: the capture failed, or a replay launched other kernels than its
        call or wrote another output (a call that acts differently while captured is timed on the stream).
        The flush is captured with the call, so in the replay the call's first kernel follows a kernel of
        the same graph, as a decode step's attention follows the layer's kernels before it."""
        torch = self.torch
        calls = _calls(fn)
        try:
            graphs, outs = self._graphs(calls)
        except Exception as e:
            torch.cuda.synchronize(self.dev)  # a broken context raises here: the job reports it
            first = (str(e).strip().splitlines() or [""])[0][:160]
            return None, f"not capturable as a CUDA graph ({type(e).__name__}: {first})"
        replays = [g.replay for g in graphs]
        why = self._same_kernels(calls, replays)
        if why:
            return None, why
        for c, g, out in zip(calls, graphs, outs):
            a = _first_tensor(out)
            if a is None:
                continue                          # nothing to compare: the kernels' check stands alone
            a.fill_(float("nan") if a.is_floating_point() else -1)   # what the replay leaves unwritten shows
            g.replay()
            got = a.clone()
            ref = _first_tensor(c())
            torch.cuda.synchronize(self.dev)
            if not same_output(got, ref, torch):
                return None, "its graph replay wrote another output than the call"
        return Rotation(replays), ""

    def _graphs(self, calls: list, flush: bool = True) -> tuple[list, list]:
        """One CUDA graph of [flush, call] captured from each call (the call alone without `flush` or
        a flush), replayed once, and the outputs the captures returned."""
        torch = self.torch
        cur = torch.cuda.current_stream(self.dev)
        graphs, outs = [], []
        for c in calls:
            g = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream(self.dev)
            side.wait_stream(cur)
            with torch.cuda.stream(side):  # capture wants a first call on a side stream
                c()
            cur.wait_stream(side)
            with torch.cuda.graph(g):
                if flush and self._flush is not None:
                    self._flush()
                outs.append(c())
            g.replay()
            graphs.append(g)
        torch.cuda.synchronize(self.dev)
        return graphs, outs

    def again(self, h):
        """A fresh capture of a graph handle's calls (a stream handle as it is), for the next round of a
        pair: two captures of one call differ by where their outputs and workspaces land (up to 1% of a
        10 µs call on an H200), so each round times new ones and the rounds' spread holds that difference."""
        fn = self._eager_of.get(id(h))
        if fn is None:
            return h
        graphs, _ = self._graphs(_calls(fn))     # the first capture passed the checks: the same calls
        new = Rotation([g.replay for g in graphs])
        self._adopt(new, fn, h)
        return new

    def _same_kernels(self, calls: list, replays: list) -> str:
        """One profiler session of the flush replayed alone, then of each call (flushed before its range)
        and its replay, each in its own range: "" when every replay launched its call's device activities
        and the flush's, else why not. Counts the flush's records (_flush_records) on the way."""
        torch, rf = self.torch, self.torch.profiler.record_function
        if self._flush is not None and self._flush_graph is None:  # captured once per timer
            (self._flush_graph,), _ = self._graphs([self._flush], flush=False)
        fg = self._flush_graph
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with self._profiler() as prof:
                torch.cuda.synchronize(self.dev)
                with rf(CALL_RANGE):
                    if fg is not None:
                        fg.replay()
                for c, r in zip(calls, replays):
                    if self._flush is not None:
                        self._flush()
                    torch.cuda.synchronize(self.dev)
                    with rf(CALL_RANGE):
                        c()
                    torch.cuda.synchronize(self.dev)
                    with rf(CALL_RANGE):
                        r()
                torch.cuda.synchronize(self.dev)
        tr = kineto_trace(prof.events())
        n = 1 + 2 * len(calls)
        if len(tr.ranges) != n:
            return "the profiler did not keep the capture check's calls"
        names = call_names(tr, n)
        self._flush_records = sum(names[0].values())
        for i in range(len(calls)):
            call, rep = names[1 + 2 * i], names[2 + 2 * i]
            if call + names[0] != rep:
                return (f"its graph replay launched other kernels than the call and the flush ({_counts(rep)} vs "
                        f"{_counts(call + names[0])})")
        return ""

    def _estimate(self, fn, calls: int = 5) -> None:
        """The median of a few event-timed flushed calls (events over-read: the estimate errs long, so
        batches sized from it never overshoot the stopping rule's minimum time; one call alone could
        read a stray long time and size every batch of a short call as if it were long)."""
        ms = sorted(self._batch(fn, calls, cupti=False)[1])  # event times of flushed calls
        self._call_ms[id(fn)] = max(ms[len(ms) // 2], 1e-3)

    def _first_batch(self, fn, rule: StopRule) -> int:
        """Calls in the first profiler session: what the rule's minimum time asks for, so a short
        call takes one session per round instead of several (a session costs ~40-65 ms of host time)."""
        ms = self._call_ms.get(id(fn))
        want = math.ceil(rule.min_time_s * 1e3 / ms) if ms else 0
        if want * 2 >= rule.max_samples:   # the sample cap will decide: all of it in one session
            want = rule.max_samples
        return max(1, self.opts.batch, min(MAX_BATCH, rule.max_samples, want))

    def sample_all(self, fns: list, rule: StopRule, eager: int = 0) -> Optional[list[Samples]]:
        """Every round of a paired timing in one profiler session, when the sample cap decides each of
        them (short calls: the first batch is the whole round, so no stopping decision falls between
        batches); None otherwise (and without CUPTI), and the caller samples round by round. With eager
        > 0 each distinct function's eager segment of that many calls rides in the same session (its
        Samples follow the rounds', in first-seen order). The rounds keep their ABBA order inside the one
        session, so the numbers are those of separate sessions."""
        if not self.cupti or any(self._first_batch(fn, rule) < rule.max_samples for fn in fns):
            return None
        t0 = clock()
        distinct = list(dict.fromkeys(self._eager_of.get(id(fn), fn) for fn in fns)) if eager else []
        segs = self._batches([(fn, rule.max_samples, False) for fn in fns] + [(fn, eager, True) for fn in distinct],
                             True)
        share = (clock() - t0) / max(len(fns), 1)
        out = []
        for i, seg in enumerate(segs):
            out.append(Samples(elapsed_s=share if i < len(fns) else 0.0))
            self._add(out[-1], *seg, eager=i >= len(fns), graph=i < len(fns) and id(fns[i]) in self._eager_of)
        return out

    def eager(self, fns: list, n: int) -> list[Samples]:
        """Host-inclusive samples of each function: n flushed calls, each started on an idle GPU."""
        if not self.cupti or n <= 0:
            return [Samples() for _ in fns]
        out = []
        for seg in self._batches([(self._eager_of.get(id(fn), fn), n, True) for fn in fns], True):
            out.append(Samples())
            self._add(out[-1], *seg, eager=True)
        return out

    def _add(self, s: Samples, facts: list, ev: list, mhz: Optional[float], eager: bool = False,
             graph: bool = False) -> None:
        """One batch's samples into s: kept, or set aside when its SM clock read low (throttled). A
        device-only call whose kernels waited for the host is not a device-only sample: dropped, counted.
        graph: the batch replayed graphs, which joined every stream they forked or would not have captured
        (their kernels' stream ids are the graph's, not a side stream's)."""
        if mhz is not None:
            s.clocks.append(mhz)
        dev = []
        for f in facts:
            if f is not None and f.side_stream and not graph:
                s.side_stream += 1
            if f is not None and f.host_bound and not eager:
                s.host_bound += 1
                continue
            dev.append(None if f is None or f.span_us is None else f.span_us / 1e3)
        if self.clock.low(mhz):
            s.low_dev += dev
            s.low_ev += ev
        else:
            s.dev += dev
            s.ev += ev

    def sample(self, fn: Callable[[], object], rule: StopRule) -> Samples:
        s, t0, size = Samples(), clock(), self._first_batch(fn, rule)
        graph = id(fn) in self._eager_of
        while True:
            n = max(1, min(size, rule.max_samples - len(s.dev)))
            self._add(s, *self._batch(fn, n, self.cupti), graph=graph)
            size = min(MAX_BATCH, size * 2)
            el = clock() - t0
            if rule.should_stop(s.primary(s.use_cupti(self.cupti)), el) or \
                    rule.capped(len(s.dev) + len(s.low_dev) + s.host_bound, el):
                break
        s.elapsed_s = clock() - t0
        return s


def _calls(fn) -> list:
    """The calls a timed function rotates over (a Rotation's), or the function alone."""
    return fn.calls if isinstance(fn, Rotation) else [fn]


def _first_tensor(x):
    """The output tensor of a call's result (the first tensor of a tuple), or None."""
    if hasattr(x, "is_floating_point") and hasattr(x, "clone"):
        return x
    if isinstance(x, (tuple, list)):
        return next((t for t in x if hasattr(t, "is_floating_point") and hasattr(t, "clone")), None)
    return None


def same_output(got, ref, torch) -> bool:
    """Whether a graph replay's output matches the call's (GRAPH_ATOL, GRAPH_RTOL; NaN never matches)."""
    if ref is None or got.shape != ref.shape:
        return False
    a, b = got.float(), ref.float()
    return bool(torch.isfinite(a).all()) and bool(((a - b).abs() <= GRAPH_ATOL + GRAPH_RTOL * b.abs()).all())


def _counts(c) -> str:
    return ", ".join(f"{n} x{k}" if k > 1 else n for n, k in sorted(c.items()))[:160] or "nothing"
