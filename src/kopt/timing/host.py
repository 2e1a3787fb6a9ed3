"""The host clock: perf_counter_ns around each call (the CPU path)."""

from __future__ import annotations

from collections.abc import Callable

from kopt.timing.options import Samples, TimingOptions, clock, clock_ns, warmup
from kopt.timing.stats import StopRule

#: Fewest ABBA rounds of a pair on the host clock, however slow its calls (a median of three ratios).
MIN_ROUNDS = 3


class HostTimer:
    """perf_counter_ns around each call."""

    cupti, cold, flush, scale, flush_kind, replay, replay_note = False, False, 0, 1.0, None, None, ""

    def __init__(self, opts: TimingOptions):
        self.opts = opts
        self.call_s: list[float] = []
        """Seconds per warm-up call of each prepared function, in order."""

    def pair_rounds(self, opts: TimingOptions) -> int:
        """Rounds of a pair on the host clock: opts.rounds, fewer (MIN_ROUNDS at least) when one call of each side
        is so slow that opts.rounds of them overrun twice the stopping rule's time cap (the torch CPU reference
        on a large cache: seconds a call, where a round of each would cost minutes)."""
        pair = sum(self.call_s[-2:])
        if pair <= 0:
            return opts.rounds
        return max(MIN_ROUNDS, min(opts.rounds, int(2 * opts.stop.max_time_s / pair)))

    def method(self, use_dev: bool) -> str:
        return "host"

    def eager(self, fns: list, n: int) -> list[Samples]:
        """No host-inclusive second figure on the host clock: its samples already include the host."""
        return [Samples() for _ in fns]

    def prepare(self, fn: Callable[[], object]) -> Callable[[], object]:
        self.call_s.append(warmup(fn, self.opts))
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
