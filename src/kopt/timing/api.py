"""time_fn and time_pair: one callable, or interleaved ABBA rounds of two, on the device's timer."""

from __future__ import annotations

from collections.abc import Callable
from functools import reduce
from typing import Optional

from kopt.hardware import is_cpu
from kopt.records import TimingStats
from kopt.timing import stats
from kopt.timing.host import HostTimer
from kopt.timing.options import PairTiming, Samples, TimingOptions, summarize


def _timer(device: str, opts: TimingOptions):
    if is_cpu(device):
        return HostTimer(opts)
    from kopt.timing.cuda import CudaTimer

    return CudaTimer(device, opts)


def _summary(t, s: Samples, use_dev: bool, eager: Optional[Samples] = None) -> TimingStats:
    """summarize() with what the timer that took the samples knows (method, cold, flush, graph scale)."""
    return summarize(s, t.method(use_dev), use_dev, t.cold, t.flush, t.scale, t.flush_kind, eager,
                     t.replay, t.replay_note)


def _eager_calls(opts: TimingOptions) -> int:
    """Calls of the host-inclusive (eager) figure: none in hot graph mode, where no span exists."""
    return 0 if opts.graph else opts.eager_calls


def time_fn(fn: Callable[[], object], device: str, opts: TimingOptions) -> TimingStats:
    """Time one callable (already called once by the caller, for compilation) on a device."""
    t = _timer(device, opts)
    h = t.prepare(fn)
    s = t.sample(h, opts.stop)
    use_dev = s.use_cupti(t.cupti)
    return _summary(t, s, use_dev, t.eager([h], _eager_calls(opts))[0])


#: A pair timed with CUPTI runs up to this many times its rounds while a side's pooled median misses the
#: stopping rule (the host clock's few samples on CPU, which serve no verdict, keep their rounds).
MORE_ROUNDS = 4


def _pooled(ra: list[Samples], rb: list[Samples], cupti: bool) -> tuple[bool, Samples, Samples]:
    """Both sides' rounds pooled, and whether CUPTI spans are used: one method for every round (if CUPTI
    failed in any round, all rounds use events)."""
    use_dev = all(x.use_cupti(cupti) for x in ra + rb)
    return use_dev, reduce(Samples.merge, ra, Samples()), reduce(Samples.merge, rb, Samples())


def _pooled_done(rule, ra: list[Samples], rb: list[Samples], cupti: bool) -> bool:
    """Whether both sides' pooled samples meet the whole rule (its CI target, or a cap). Each round stops
    on its share of the rule (StopRule.split), which assumes the rounds agree; when their medians differ
    (a call whose spans shift between captures: R2's upper tail on an H200) the pooled CI stays wide, and
    more rounds are what narrows it."""
    use_dev, pa, pb = _pooled(ra, rb, cupti)
    return all(rule.should_stop(p.primary(use_dev), p.elapsed_s) for p in (pa, pb))


def _abba(r: int, a: tuple, b: tuple) -> list[tuple]:
    """Round r's order of the two sides: A B, B A, A B, ... (drifts hit both sides alike)."""
    return [a, b] if r % 2 == 0 else [b, a]


def time_pair(fn_a: Callable[[], object], fn_b: Callable[[], object], device: str,
              opts: TimingOptions) -> PairTiming:
    """Interleaved ABBA rounds of candidate a and baseline b; speedup = median per-round time_b / time_a.
    More pairs of rounds follow (up to MORE_ROUNDS x rounds) while a side's pooled samples miss the rule."""
    t = _timer(device, opts)
    ha, hb = t.prepare_all([fn_a, fn_b], ("candidate", "baseline"))  # both replayed as graphs, or neither
    rounds = max(1, t.pair_rounds(opts) if hasattr(t, "pair_rounds") else opts.rounds)
    rule = opts.stop.split(rounds)
    ra: list[Samples] = []
    rb: list[Samples] = []
    order = []
    for r in range(rounds):
        if r:  # graph replays: each round its own captures (kopt.timing.cuda.CudaTimer.again)
            ha, hb = t.again(ha), t.again(hb)
        order += _abba(r, (ha, ra), (hb, rb))
    together = getattr(t, "sample_all", None)  # all rounds in one session, where the timer can
    n_eager = _eager_calls(opts)
    got = together([h for h, _ in order], rule, n_eager) if together else None
    for (h, acc), s in zip(order, got or [None] * len(order)):
        acc.append(s if s is not None else t.sample(h, rule))
    # the eager figure runs the calls; sample_all adds its segments only when asked for some (n_eager > 0)
    ea, eb = got[len(order):] if got and n_eager else t.eager([ha, hb], n_eager)
    r = rounds
    while t.cupti and r < MORE_ROUNDS * rounds and not _pooled_done(opts.stop, ra, rb, t.cupti):
        for _ in range(2):  # one more A B, B A pair of rounds, each with fresh captures
            ha, hb = t.again(ha), t.again(hb)
            for h, acc in _abba(r, (ha, ra), (hb, rb)):
                acc.append(t.sample(h, rule))
            r += 1
    use_dev, pa, pb = _pooled(ra, rb, t.cupti)
    ps = stats.paired_speedup([x.values(use_dev)[0] for x in ra], [x.values(use_dev)[0] for x in rb])
    return PairTiming(
        a=_summary(t, pa, use_dev, ea), b=_summary(t, pb, use_dev, eb),
        ratios=ps.ratios, speedup=ps.speedup, ci=ps.ci,
    )
