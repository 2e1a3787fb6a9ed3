"""Timing: cold CUPTI kernel spans, hot CUDA-graph replay, the host clock on CPU, ABBA pairs.

On CUDA each timed call runs inside a `kopt::call` profiler range; its device time is the span
from the first to the last device activity (kernel, memset, memcpy) whose launch happened inside
that range, so a split kernel and its combine both count and the flush (launched outside every
range) never does. The timed calls are device-only: a spin kernel holds the stream while the host
enqueues them ahead of the device, and a call one of whose kernels still waited for its launch is
dropped (counted in `host_bound`). Each call is a replay of a CUDA graph captured from it (replay
"graph", where the candidate and the baseline both capture and replay their own kernels), so the
device starts a call's second kernel as a serving engine's graph does, without the stream's launch
gap. The eager, host-inclusive figure is a second one: calls started on an idle device, so the
host's launches between a call's kernels are inside its span. CUDA events around one call in
EVENT_EVERY are recorded too, as a cross-check (they add launch overhead); without CUPTI they are
the samples, around every call.
"""

from kopt.timing.api import time_fn, time_pair
from kopt.timing.cuda import make_flush
from kopt.timing.cupti import kineto_trace, profiler
from kopt.timing.options import (
    CALL_RANGE,
    LOW_CLOCK_FRAC,
    MAX_BATCH,
    MAX_MISSING,
    PairTiming,
    Rotation,
    Samples,
    TimingOptions,
    rotating,
    summarize,
)

__all__ = ["CALL_RANGE", "LOW_CLOCK_FRAC", "MAX_BATCH", "MAX_MISSING", "PairTiming", "Rotation", "Samples",
           "TimingOptions", "kineto_trace", "make_flush", "profiler", "rotating", "summarize", "time_fn", "time_pair"]
