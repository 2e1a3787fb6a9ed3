"""Timing options, the samples and their summary, the harness's own clock: what every timer shares."""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from kopt.hardware import is_cpu
from kopt.records import FLUSH_KINDS, REPLAYS, FlushKind, Replay, TimingStats
from kopt.timing import stats
from kopt.timing.stats import StopRule

CALL_RANGE = "kopt::call"
#: Batches whose SM clock reads below this fraction of the default clock are dropped (throttled).
LOW_CLOCK_FRAC = 0.75
#: Calls per profiler session: the first batch (sized from the stopping rule's minimum time),
#: then doubling up to the cap. A session costs ~40-65 ms of host time on an H200 (torch 2.11,
#: opened and closed); 1000 calls keep that under ~65 µs a sample, and a session's kineto buffers
#: at tens of thousands of events.
MAX_BATCH = 1000
#: CUPTI is trusted when at most this fraction of calls lacks device records; else events.
MAX_MISSING = 0.1
FLOOR_MS = 1e-6          # TimingStats wants > 0; a host call can read 0 ns

#: Threads of a CPU evaluation (torch's intra-op pool, so the torch reference, and OpenMP in a candidate's
#: compiled code): $KOPT_CPU_THREADS, else 1. One, because the two sides of a CPU pair must run under the
#: same setting and the C kernel is serial; and because a 2-thread torch reference on a 2-core host swings
#: with whatever else runs there (case 10's torch-cpu reference read 85-419 ms; an OpenMP region waits for
#: its slowest thread), while a one-thread call loses a core only when the host has none to spare.
ENV_CPU_THREADS = "KOPT_CPU_THREADS"


def cpu_threads() -> int:
    """The thread count CPU evaluations run under ($KOPT_CPU_THREADS, else 1; a bad value: 1)."""
    import os

    try:
        return max(1, int(os.environ.get(ENV_CPU_THREADS, "1")))
    except ValueError:
        return 1


def pin_cpu_threads() -> int:
    """Set this process's torch (and OpenMP) thread count to cpu_threads(); returns it."""
    import os

    import torch

    n = cpu_threads()
    os.environ["OMP_NUM_THREADS"] = str(n)  # OpenMP runtimes a candidate's library starts later
    torch.set_num_threads(n)
    return n


# Bound once at import (the worker imports this module before any candidate): a candidate that patches
# time.perf_counter later cannot change what the harness reads.
clock, clock_ns = time.perf_counter, time.perf_counter_ns


@dataclass

class TimingOptions:
    """How to time: cold (flushed L2) or hot (graph replay), warm-up, rounds, stopping rule."""

    cold: bool = True
    graph: bool = False
    flush: FlushKind = "read"
    """Cold flush: "read" (read a zeroed buffer: inputs evicted, L2 left clean) or "zero" (zero it,
    as nvbench and Triton do: L2 left full of dirty lines that the timed call writes back)."""
    rounds: int = 6
    warmup_s: float = 0.025
    warmup_calls: int = 10
    stop: StopRule = field(default_factory=StopRule)
    batch: int = 50
    """Calls in the first profiler session (later sessions double, up to MAX_BATCH)."""
    graph_calls: int = 20
    """Calls captured in one CUDA graph in hot mode; per-call time = replay time / graph_calls."""
    eager_calls: int = 40
    """Calls of the host-inclusive second figure (each flushed, then started on an idle device)."""
    replay: Replay = "graph"
    """Device-only cold calls: "graph" replays each call as a CUDA graph of [flush, call] captured from it
    (its kernels launched back to back by the device, as a serving engine's decode step runs them), where
    both sides of a timing capture and replay their calls' own kernels; "stream" launches the flush and the
    call's kernels one by one on the stream (each kernel pays the device's launch gap after the one before)."""

    @classmethod
    def for_device(cls, device: str, quick: bool = False, cold: Optional[bool] = None,
                   graph: Optional[bool] = None, flush: Optional[str] = None,
                   replay: Optional[str] = None, eager_calls: Optional[int] = None) -> TimingOptions:
        """Defaults for a device: DESIGN.md's numbers on GPUs; a few host-clock samples on CPU.
        cold / graph / flush / replay / eager_calls, when given, override the device's default."""
        opts = cls._defaults(device, quick)
        if eager_calls is not None:
            opts.eager_calls = eager_calls
        if replay is not None:
            if replay not in REPLAYS:
                raise ValueError(f"unknown replay {replay!r}; use one of {', '.join(REPLAYS)}")
            opts.replay = replay
        if cold is not None:
            opts.cold = cold
        if graph is not None:
            opts.graph = graph
        if flush is not None:
            if flush not in FLUSH_KINDS:
                raise ValueError(f"unknown flush {flush!r}; use one of {', '.join(FLUSH_KINDS)}")
            opts.flush = flush
        return opts

    @classmethod
    def _defaults(cls, device: str, quick: bool) -> TimingOptions:
        if is_cpu(device):
            # The CPU path runs the whole loop without a GPU: no flush (it would cost more than the call), the
            # host clock, one thread a side (cpu_threads). Its noise is the host's load, which moves on a scale of
            # seconds: many short interleaved rounds (each side gets ~1/rounds of the budget per round) put both
            # sides under the same load, and the median over rounds drops a round a burst hit. Two rounds of
            # ~0.75 s each read case 10 at 9.2-17.0x across runs on a shared 2-core host.
            stop = StopRule(min_samples=3, min_time_s=0.0, target_rel_ci=0.02,
                            max_time_s=0.6 if quick else 2.4, max_samples=60 if quick else 400)
            return cls(cold=False, rounds=4 if quick else 8, warmup_s=0.0 if quick else 0.02,
                       warmup_calls=1, stop=stop)
        if quick:
            stop = StopRule(min_samples=20, min_time_s=0.0, target_rel_ci=0.02,
                            max_time_s=0.5, max_samples=200)
            return cls(rounds=2, stop=stop, eager_calls=15)
        return cls()


@dataclass
class PairTiming:
    """Candidate (a) against baseline (b) from interleaved ABBA rounds; speedup = time_b / time_a."""

    a: TimingStats
    b: TimingStats
    ratios: list[float]
    speedup: float
    ci: tuple[float, float]


@dataclass
class Samples:
    """Per-call samples of one function (one round or pooled): device spans and events, kept or low-clock.

    dev holds one entry per call (None: no CUPTI record); with CUPTI, ev holds the event time of
    every EVENT_EVERY-th call only (a cross-check), without it one per call."""

    dev: list[Optional[float]] = field(default_factory=list)
    ev: list[float] = field(default_factory=list)
    low_dev: list[Optional[float]] = field(default_factory=list)
    low_ev: list[float] = field(default_factory=list)
    clocks: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0
    host_bound: int = 0
    """Device-only calls dropped because a kernel of theirs waited for the host (kopt.timing.cupti.CallFacts)."""
    side_stream: int = 0
    """Calls that left work on another stream, not joined to the caller's before returning."""

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
        if len(ms) >= 3 or not (self.low_dev or self.low_ev):
            return ms, False
        both = Samples(dev=self.dev + self.low_dev, ev=self.ev + self.low_ev)
        return both.primary(use_dev), True

    def merge(self, other: Samples) -> Samples:
        """Pool two sample sets."""
        return Samples(self.dev + other.dev, self.ev + other.ev, self.low_dev + other.low_dev,
                       self.low_ev + other.low_ev, self.clocks + other.clocks,
                       self.elapsed_s + other.elapsed_s, self.host_bound + other.host_bound,
                       self.side_stream + other.side_stream)


def summarize(s: Samples, method: str, use_dev: bool, cold: bool, flush: int, scale: float = 1.0,
              flush_kind: Optional[str] = None, eager: Optional[Samples] = None,
              replay: Optional[str] = None, replay_note: str = "") -> TimingStats:
    """TimingStats from samples; `scale` turns per-replay times into per-call times (graphs)."""
    ms, forced = s.values(use_dev)
    x = np.maximum(np.asarray(ms, dtype=float) * scale, FLOOR_MS)
    q1, med, q3 = np.percentile(x, [25, 50, 75])
    ri = stats.rel_iqr(x)
    ev_med = float(np.median(s.ev)) * scale if s.ev and method != "host" else None
    return TimingStats(
        method=method, median_ms=float(med), q1_ms=float(q1), q3_ms=float(q3), min_ms=float(x.min()),
        n=int(x.size), rel_iqr=ri, ci_rel=stats.ci_rel(x), noisy=stats.noisy(ri) or forced,
        cold=cold, flush_bytes=flush, flush_kind=flush_kind,
        mean_clock_mhz=float(np.mean(s.clocks)) if s.clocks else None,
        dropped_low_clock=0 if forced else max(len(s.low_dev), len(s.low_ev)), events_median_ms=ev_med,
        total_s=s.elapsed_s, device_only=method == "cupti", host_bound=s.host_bound,
        side_stream=s.side_stream + (eager.side_stream if eager else 0), eager_median_ms=eager_ms(eager),
        replay=replay if method == "cupti" else None, replay_note=replay_note if method == "cupti" else "",
    )


def eager_ms(e: Optional[Samples]) -> Optional[float]:
    """Median host-inclusive span of an eager segment; None when it has no CUPTI spans."""
    ms = [d for d in (e.dev + e.low_dev if e else []) if d is not None]
    return max(float(np.median(ms)), FLOOR_MS) if ms else None


class Rotation:
    """A no-argument call that runs calls[1], calls[2], ... (wrapping) in turn, so consecutive timed
    calls never see the same inputs twice in a row; the timer reads `calls` to capture each one."""

    def __init__(self, calls: list[Callable[[], object]]):
        self.calls = list(calls)
        self._next = itertools.count(1)

    def __call__(self):
        return self.calls[next(self._next) % len(self.calls)]()


def rotating(fn: Callable[[object], object], inputs: list) -> Rotation:
    """fn over rotated input sets: inputs[1], inputs[2], ... (a Rotation of fn on each)."""
    return Rotation([functools.partial(fn, w) for w in inputs])


def warmup(fn, opts: TimingOptions, before=None, after=None) -> float:
    """Call fn until both warmup_calls and warmup_s are reached (after the caller's compile call); returns the
    seconds per call it took."""
    t0, n = clock(), 0
    while n < opts.warmup_calls or clock() - t0 < opts.warmup_s:
        before and before()
        fn()
        after and after()
        n += 1
    return (clock() - t0) / max(n, 1)
