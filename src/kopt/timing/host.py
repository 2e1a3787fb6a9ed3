"""The host clock: perf_counter_ns around each call (the CPU path)."""

from __future__ import annotations

from collections.abc import Callable

from kopt.timing.options import Samples, TimingOptions, clock, clock_ns, warmup
from kopt.timing.stats import StopRule


class HostTimer:
    """perf_counter_ns around each call."""

    cupti, cold, flush, scale, flush_kind, replay, replay_note = False, False, 0, 1.0, None, None, ""

    def __init__(self, opts: TimingOptions):
        self.opts = opts

    def method(self, use_dev: bool) -> str:
        return "host"

    def eager(self, fns: list, n: int) -> list[Samples]:
        """No host-inclusive second figure on the host clock: its samples already include the host."""
        return [Samples() for _ in fns]

    def prepare(self, fn: Callable[[], object]) -> Callable[[], object]:
        warmup(fn, self.opts)
        return fn

    def prepare_all(self, fns: list, labels: tuple[str, ...] = ()) -> list:
        return [self.prepare(fn) for fn in fns]

    def again(self, fn):
        return fn

    def sample(self, fn: Callable[[], object], rule: StopRule) -> Samples:
        s, t0, check = Samples(), clock(), 1
        while True:
            a = clock_ns()
            fn()
            s.ev.append((clock_ns() - a) / 1e6)
            # The CI costs O(n); check on a geometric schedule so the loop stays O(n log n).
            if len(s.ev) >= check:
                check = len(s.ev) + max(1, len(s.ev) // 10)
                if rule.should_stop(s.ev, clock() - t0):
                    break
        s.elapsed_s = clock() - t0
        return s
