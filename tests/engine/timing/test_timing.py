"""kopt.timing: CUPTI span extraction on synthetic records, host timing on CPU, GPU checks (gpu marker)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from kopt import timing
from kopt.timing import CALL_RANGE, Samples, TimingOptions, cupti
from kopt.timing.stats import StopRule


def _busy(ms: float):
    def f():
        end = time.perf_counter() + ms / 1e3
        while time.perf_counter() < end:
            pass
    return f


# ---------------------------------------------------------------- pure span extraction

def test_call_spans_two_kernels_and_exclusions():
    recs = [
        ("flush", 0.0, 50.0, -1),                  # harness: outside every call
        ("split_kv", 60.0, 80.0, 0),
        ("combine", 82.0, 90.0, 0),                # the span covers both kernels and the gap
        ("flush", 100.0, 150.0, -1),
        ("kopt_internal", 151.0, 152.0, 1),        # excluded by name
        ("split_kv", 160.0, 181.0, 1),
    ]
    assert cupti.call_spans(recs, 3, exclude=("kopt_",)) == [30.0, 21.0, None]
    assert cupti.call_spans(recs, 2) == [30.0, 30.0]


def test_attribute_calls_by_launch_time():
    ranges = [(1000, 2000), (5000, 6000)]          # host ranges of the two timed calls (ns)
    dev = [
        ("zero", 2500, 4000, 1500.0 - 1000),       # launched at 500 ns: before call 0 (a flush)
        ("k1", 7000, 8000, 1200),                  # launched inside call 0
        ("k2", 8000, 9000, 1900),
        ("zero", 9000, 9500, 3000),                # launched between calls
        ("k1", 10000, 12000, 5100),                # call 1
        ("lost", 13000, 14000, None),              # no launch record
    ]
    out = cupti.attribute_calls(ranges, dev)
    assert [r[3] for r in out] == [-1, 0, 0, -1, 1, -1]
    assert out[1][1:3] == (7.0, 8.0)               # ns -> µs
    assert cupti.call_spans(out, 2) == [2.0, 2.0]


class _Ev:
    """Stand-in for torch's _KinetoEvent with the accessors kineto_records uses."""

    def __init__(self, name, dev, start, end, corr, linked=0, ann=False):
        self._a = (name, dev, start, end, corr, linked, ann)

    def name(self): return self._a[0]
    def device_type(self): return f"DeviceType.{self._a[1]}"
    def start_ns(self): return self._a[2]
    def end_ns(self): return self._a[3]
    def correlation_id(self): return self._a[4]
    def linked_correlation_id(self): return self._a[5]
    def is_user_annotation(self): return self._a[6]


def test_kineto_records_layout_seen_on_torch_2_11():
    # The layout printed by torch 2.11 + CUPTI on an H200: the device record shares its
    # correlation id with cudaLaunchKernel and links to the aten op's id.
    evs = [
        _Ev("kopt::flush", "CPU", 100, 200, 513, ann=True),
        _Ev("aten::fill_", "CPU", 110, 190, 515),
        _Ev("cudaLaunchKernel", "CPU", 120, 130, 27, 515),
        _Ev("fill_kernel", "CUDA", 140, 400, 27, 515),
        _Ev("kopt::flush", "CUDA", 140, 400, 513, ann=True),
        _Ev(CALL_RANGE, "CPU", 210, 300, 516, ann=True),
        _Ev("aten::add_", "CPU", 220, 250, 517),
        _Ev("cudaLaunchKernel", "CPU", 230, 240, 36, 517),
        _Ev("add_kernel", "CUDA", 410, 420, 36, 517),
        _Ev("aten::mul_", "CPU", 260, 290, 518),
        _Ev("cuLaunchKernel", "CPU", 270, 280, 43, 518),
        _Ev("mul_kernel", "CUDA", 425, 440, 43, 518),
        _Ev("memset_no_runtime_record", "CUDA", 441, 445, 99, 518),   # falls back to the aten op
        _Ev(CALL_RANGE, "CUDA", 410, 445, 516, ann=True),
    ]
    base = 1_795_935_191_829_970_104                 # real kineto timestamps: ns since the epoch
    for e in evs:
        a = e._a
        e._a = (a[0], a[1], a[2] + base, a[3] + base, *a[4:])
    ranges, recs = cupti.kineto_records(evs)
    assert ranges == [(70, 160)]                     # shifted to the first timestamp (140)
    spans = cupti.call_spans(cupti.attribute_calls(ranges, recs), 1)
    assert spans == [pytest.approx(0.035, abs=1e-9)]  # no 256-ns float rounding


def _rec(name, start, end, launch, stream=7):
    return cupti.DeviceRecord(name, start * 1e3, end * 1e3, launch * 1e3, stream)


def test_call_facts_device_only_and_host_bound():
    # Two calls of a split + combine design; the harness's hold and flush (stream 7) outside both ranges.
    tr = cupti.Trace(
        ranges=[(0.0, 10e3), (200e3, 260e3)],
        records=[_rec("spin", 0, 40, -1), _rec("flush", 41, 100, -0.5),
                 _rec("split", 101, 110, 1), _rec("combine", 110.5, 113, 2),    # launched long before
                 _rec("flush", 114, 170, 15),
                 _rec("split", 201, 214, 200.5), _rec("combine", 251, 253, 250)],  # launched after split ended
        joins=[])
    facts = cupti.call_facts(tr, 2, cupti.main_stream_of(tr))
    assert [f.span_us for f in facts] == [pytest.approx(12.0), pytest.approx(52.0)]
    assert [f.host_bound for f in facts] == [False, True]
    assert not any(f.side_stream for f in facts)


def test_call_facts_side_stream_needs_a_join_after_the_last_side_launch():
    def trace(joins):
        return cupti.Trace(ranges=[(0.0, 10e3)], records=[_rec("flush", 0, 50, -1, stream=7),
                                                          _rec("k", 60, 70, 2, stream=13)], joins=joins)

    assert cupti.main_stream_of(trace([])) == 7
    assert cupti.call_facts(trace([]), 1, 7)[0].side_stream                 # never joined
    assert cupti.call_facts(trace([1e3]), 1, 7)[0].side_stream              # a wait before the launch only
    assert not cupti.call_facts(trace([1e3, 5e3]), 1, 7)[0].side_stream     # joined after it
    assert cupti.call_facts(trace([20e3]), 1, 7)[0].side_stream             # after run returned: too late
    assert not cupti.call_facts(trace([]), 1, None)[0].side_stream          # no harness stream known


def test_device_only_batch_drops_host_bound_calls_and_counts_side_streams():
    from kopt.timing.cuda import CudaTimer

    t = CudaTimer.__new__(CudaTimer)
    t.clock = type("C", (), {"low": staticmethod(lambda mhz: False)})()
    s = Samples()
    facts = [cupti.CallFacts(0.012), cupti.CallFacts(0.026, host_bound=True), cupti.CallFacts(None),
             cupti.CallFacts(0.013, side_stream=True)]
    CudaTimer._add(t, s, facts, [0.02], 1980.0)
    assert s.dev == [pytest.approx(12e-6), None, pytest.approx(13e-6)] and s.host_bound == 1 and s.side_stream == 1
    e = Samples()
    g = Samples()
    CudaTimer._add(t, g, facts, [], 1980.0, graph=True)                    # a replayed graph joined its streams
    assert g.side_stream == 0 and g.host_bound == 1
    CudaTimer._add(t, e, facts, [], 1980.0, eager=True)                    # eager spans keep the host's gaps
    assert len(e.dev) == 4 and e.host_bound == 0
    st = timing.summarize(s, "cupti", True, True, 256 << 20, eager=e)
    assert st.device_only and st.host_bound == 1 and st.side_stream == 2
    assert st.eager_median_ms == pytest.approx(13e-6)


# ---------------------------------------------------------------- summaries

def test_summarize_low_clock_and_fallbacks():
    s = Samples(dev=[1.0, 1.0, 1.0], ev=[1.2, 1.2, 1.3], low_dev=[2.0], low_ev=[2.2], clocks=[1980.0, 900.0])
    st = timing.summarize(s, "cupti", True, True, 256 << 20)
    assert st.median_ms == 1.0 and st.n == 3 and st.dropped_low_clock == 1
    assert st.events_median_ms == 1.2 and st.mean_clock_mhz == 1440.0 and st.noisy is False
    assert Samples(dev=[1.0] * 10 + [None]).use_cupti(True)          # 1 of 11 without records
    assert not Samples(dev=[1.0] * 8 + [None] * 2).use_cupti(True)   # 20%: fall back to events
    assert not s.use_cupti(False)
    throttled = Samples(low_dev=[1.0] * 5, low_ev=[1.1] * 5)
    st2 = timing.summarize(throttled, "events", False, True, 0)
    assert st2.noisy is True and st2.n == 5 and st2.dropped_low_clock == 0
    graph = timing.summarize(Samples(ev=[20.0] * 4), "graph", False, False, 0, scale=1 / 20)
    assert graph.median_ms == pytest.approx(1.0) and graph.events_median_ms == pytest.approx(1.0)


def test_summarize_thinned_events():
    """With CUPTI, events bracket one call in EVENT_EVERY: the spans are the samples, the events a cross-check."""
    s = Samples(dev=[1.0] * 15 + [3.0], ev=[1.3, 1.4], low_dev=[2.0] * 8, low_ev=[2.1])
    st = timing.summarize(s, "cupti", True, True, 256 << 20)
    assert st.n == 16 and st.median_ms == 1.0 and st.dropped_low_clock == 8
    assert st.events_median_ms == pytest.approx(1.35)
    # only low-clock spans kept and fewer than 3 normal ones: every sample is used, flagged noisy
    few = timing.summarize(Samples(dev=[1.0], low_dev=[2.0] * 4, low_ev=[2.1]), "cupti", True, True, 0)
    assert few.n == 5 and few.noisy is True and few.dropped_low_clock == 0


def test_options_for_device():
    cpu = TimingOptions.for_device("cpu")
    assert cpu.cold is False and cpu.rounds == 8 and cpu.stop.min_samples == 3 and cpu.stop.max_time_s <= 2.4
    assert TimingOptions.for_device("cpu", quick=True).rounds == 4
    gpu = TimingOptions.for_device("cuda")
    assert gpu.cold and gpu.rounds == 6 and gpu.stop == StopRule()
    assert gpu.warmup_s == 0.025 and gpu.warmup_calls == 10
    assert TimingOptions.for_device("cuda:0", quick=True).stop.max_time_s < 1.0


def test_make_flush_reads_or_zeroes_the_buffer():
    import torch

    from kopt.timing.cuda import make_flush

    buf = torch.zeros((1 << 16) + 3, dtype=torch.uint8)   # a length that is not a multiple of 4
    read = make_flush(buf, "read")
    assert float(read()[0]) == 0.0 and int(buf.sum()) == 0   # reads, writes nothing
    buf[7] = 9
    assert float(make_flush(buf, "read")()[0]) != 0.0       # it did read the bytes
    make_flush(buf, "zero")()
    assert int(buf.sum()) == 0


def test_flush_kind_option():
    assert TimingOptions.for_device("cuda").flush == "read"
    assert TimingOptions.for_device("cuda", flush="zero").flush == "zero"
    with pytest.raises(ValueError, match="unknown flush"):
        TimingOptions.for_device("cuda", flush="memset")


# ---------------------------------------------------------------- host clock

class VirtualClock:
    """The host timer's clock, advanced only by the calls it times: the figures are the calls' own, whatever the
    machine's load (the real clock's figures are the load's call: checked for their structure only, below)."""

    def __init__(self):
        self.t_ns = 0

    def ns(self) -> int:
        return self.t_ns

    def s(self) -> float:
        return self.t_ns / 1e9

    def work(self, ms: float):
        def f():
            self.t_ns += round(ms * 1e6)
        return f


@pytest.fixture
def vclock(monkeypatch) -> VirtualClock:
    from kopt.timing import host, options

    c = VirtualClock()
    for mod in (host, options):
        monkeypatch.setattr(mod, "clock", c.s)
        monkeypatch.setattr(mod, "clock_ns", c.ns)
    return c


def test_time_fn_cpu_measures_the_call(vclock):
    st = timing.time_fn(vclock.work(1.0), "cpu", TimingOptions.for_device("cpu"))
    assert st.method == "host" and st.cold is False and st.flush_bytes == 0
    assert st.median_ms == st.min_ms == st.q1_ms == st.q3_ms == pytest.approx(1.0) and st.rel_iqr == 0
    assert st.n >= 3 and st.events_median_ms is None
    assert st.total_s == pytest.approx(st.n * 1e-3)                       # its samples' time, no more


def test_time_fn_cpu_busy_function_on_the_real_clock():
    """The real clock: a 1 ms busy-wait cannot take less than 1 ms; how much more is the machine's load."""
    st = timing.time_fn(_busy(1.0), "cpu", TimingOptions.for_device("cpu"))
    assert st.method == "host" and st.cold is False and st.flush_bytes == 0
    assert st.median_ms >= 1.0 and st.min_ms >= 1.0 and st.min_ms <= st.median_ms and st.q1_ms <= st.q3_ms
    assert st.n >= 3 and st.events_median_ms is None and st.total_s >= st.n * 1e-3


def test_time_fn_cpu_respects_caps(vclock):
    opts = TimingOptions(cold=False, warmup_calls=1, warmup_s=0.0,
                         stop=StopRule(min_samples=10**6, min_time_s=0.0, max_time_s=0.05, max_samples=10**6))
    st = timing.time_fn(vclock.work(0.2), "cpu", opts)
    # the time cap ends sampling: 0.05 s of 0.2 ms calls, give or take the CI check's geometric schedule
    assert 250 <= st.n <= 280 and st.total_s == pytest.approx(st.n * 2e-4)
    opts.stop = StopRule(min_samples=10**6, min_time_s=0.0, max_time_s=10**6, max_samples=40)
    assert 40 <= timing.time_fn(vclock.work(0.2), "cpu", opts).n <= 45   # the sample cap, likewise


def test_time_pair_cpu_half_speed(vclock):
    """ABBA rounds of a candidate twice the baseline's work: the speedup is the per-round medians' ratio, 0.5."""
    opts = TimingOptions.for_device("cpu")
    opts.rounds = 6
    pt = timing.time_pair(vclock.work(2.0), vclock.work(1.0), "cpu", opts)   # a = candidate, 2x slower
    assert pt.ratios == pytest.approx([0.5] * 6) and pt.speedup == pytest.approx(0.5)
    assert pt.ci == pytest.approx((0.5, 0.5))
    assert pt.a.median_ms == pytest.approx(2.0) and pt.b.median_ms == pytest.approx(1.0)
    assert pt.a.method == pt.b.method == "host"


def test_time_pair_cpu_on_the_real_clock():
    """The real clock: the pair's structure (rounds, a CI around the median ratio); its value is the load's call."""
    x = np.random.default_rng(0).random(20000)
    fast = lambda: np.sort(x)  # noqa: E731
    opts = TimingOptions.for_device("cpu")
    opts.rounds = 6
    pt = timing.time_pair(lambda: (fast(), fast()), fast, "cpu", opts)
    assert len(pt.ratios) == 6 and all(r > 0 for r in pt.ratios)
    assert pt.ci[0] <= pt.speedup <= pt.ci[1] and pt.speedup == pytest.approx(float(np.median(pt.ratios)))
    assert pt.a.method == pt.b.method == "host" and pt.a.n >= 3 and pt.b.n >= 3


# ---------------------------------------------------------------- GPU

@pytest.mark.gpu
def test_gpu_empty_kernel_cupti_vs_events():
    import torch

    x = torch.empty(1, device="cuda")
    fn = lambda: x.add_(1)  # noqa: E731
    fn()
    st = timing.time_fn(fn, "cuda", TimingOptions.for_device("cuda", quick=True))
    assert st.method == "cupti" and st.cold and st.flush_bytes >= 256 << 20 and st.flush_kind == "read"
    assert 0 < st.median_ms < 0.05                  # an empty-ish kernel runs in microseconds
    assert st.events_median_ms >= st.median_ms      # events add launch overhead


@pytest.mark.gpu
def test_gpu_two_kernel_span_covers_both():
    import torch

    a = torch.randn(16 << 20, device="cuda")        # 64 MiB: each pass ~30 µs, past launch noise
    b = torch.randn(16 << 20, device="cuda")
    one = lambda: a.mul_(1.0001)  # noqa: E731
    two = lambda: (a.mul_(1.0001), b.mul_(1.0001))  # noqa: E731
    opts = TimingOptions.for_device("cuda", quick=True)
    t1, t2 = timing.time_fn(one, "cuda", opts), timing.time_fn(two, "cuda", opts)
    assert t1.method == t2.method == "cupti"
    assert t2.median_ms >= 1.8 * t1.median_ms
    from kopt.timing import cuda as timing_cuda

    spans, ev, _ = timing_cuda.CudaTimer("cuda", opts)._batch(two, 17, cupti=True)
    assert len(spans) == 17 and all(x is not None for x in spans)
    assert len(ev) == -(-17 // timing_cuda.EVENT_EVERY) and min(ev) > 0


@pytest.mark.gpu
def test_gpu_zero_flush_charges_the_write_back_to_the_call():
    # A plain read of 128 MiB (twice L2 on an H200): after a zeroing flush the call also writes back the
    # dirty lines its reads evict; after the read flush it does not. Both flushes evict the input.
    import torch

    x = torch.ones(32 << 20, device="cuda")
    fn = lambda: x.sum()  # noqa: E731
    fn()
    got = {}
    for kind in ("read", "zero"):
        st = timing.time_fn(fn, "cuda", TimingOptions.for_device("cuda", quick=True, flush=kind))
        assert st.flush_kind == kind and st.cold
        got[kind] = st.median_ms
    assert got["zero"] > got["read"] * 1.03, got


@pytest.mark.gpu
def test_gpu_capped_pair_runs_every_round_in_one_session():
    # A rule whose minimum time no short call can reach: the cap decides every round, so all rounds run
    # in one profiler session (sample_all), every call still gets its own CUPTI span.
    import torch

    from kopt.timing import cuda as timing_cuda

    a = torch.randn(4 << 20, device="cuda")
    one, two = (lambda: a.mul_(1.0001)), (lambda: (a.mul_(1.0001), a.mul_(1.0001)))  # noqa: E731
    opts = TimingOptions.for_device("cuda")
    opts.stop = StopRule(min_samples=10, min_time_s=100.0, target_rel_ci=0.0, max_time_s=60.0, max_samples=240)
    timer = timing_cuda.CudaTimer("cuda", opts)
    rule = opts.stop.split(opts.rounds)
    h1, h2 = timer.prepare(one), timer.prepare(two)
    got = timer.sample_all([h1, h2, h2, h1], rule)
    assert got is not None and [len(s.dev) + len(s.low_dev) for s in got] == [rule.max_samples] * 4
    assert all(s.use_cupti(True) for s in got)
    pt = timing.time_pair(two, one, "cuda", opts)
    assert pt.a.n + pt.a.dropped_low_clock == 240 and pt.a.method == "cupti"
    assert pt.speedup == pytest.approx(0.5, rel=0.15)


@pytest.mark.gpu
def test_gpu_graph_and_pair():
    import torch

    a = torch.randn(16 << 20, device="cuda")
    opts = TimingOptions.for_device("cuda", quick=True)
    opts.graph = True
    st = timing.time_fn(lambda: a.mul_(1.0001), "cuda", opts)
    assert st.method == "graph" and st.cold is False and st.median_ms > 0
    pt = timing.time_pair(lambda: (a.mul_(1.0001), a.mul_(1.0001)), lambda: a.mul_(1.0001), "cuda",
                          TimingOptions.for_device("cuda", quick=True))
    assert pt.speedup == pytest.approx(0.5, rel=0.15)


# ---------------------------------------------------------------- graph replays

def test_rotation_runs_each_call_in_turn_from_the_second():
    seen = []
    r = timing.rotating(seen.append, ["a", "b", "c"])
    assert isinstance(r, timing.Rotation) and len(r.calls) == 3
    for _ in range(4):
        r()
    assert seen == ["b", "c", "a", "b"]
    r.calls[0]()                                       # each call is one input set's, for capture
    assert seen[-1] == "a"


def test_call_names_per_call():
    tr = cupti.Trace(ranges=[(0.0, 10e3), (20e3, 30e3)],
                     records=[_rec("flush", 0, 5, -1), _rec("split", 6, 8, 1), _rec("combine", 8.1, 9, 1),
                              _rec("flush", 10, 15, 15), _rec("split", 21, 23, 20.5), _rec("combine", 23, 24, 20.5)],
                     joins=[])
    a, b = cupti.call_names(tr, 2)
    assert a == b == {"split": 1, "combine": 1}
    tr = cupti.Trace(ranges=[(0.0, 10e3), (20e3, 30e3)],
                     records=[_rec("Memset (Device)", 1, 2, 1), _rec("Memset (Unknown)", 21, 22, 20.5)], joins=[])
    a, b = cupti.call_names(tr, 2)
    assert a == b == {"Memset": 1}                      # the memory kind kineto names is not the activity


def test_replayed_flush_is_dropped_by_its_place():
    # Two replays of a graph of [flush, call]: every record shares the graph launch's time; the flush's two
    # records run first and are dropped from the span by count (lead), so a call kernel named like the
    # flush's still counts.
    tr = cupti.Trace(ranges=[(0.0, 10e3), (200e3, 210e3)],
                     records=[_rec("spin", 0, 40, -1),
                              _rec("memset", 41, 42, 1), _rec("reduce", 42, 100, 1), _rec("reduce", 101, 104, 1),
                              _rec("memset", 141, 142, 201), _rec("reduce", 142, 200, 201),
                              _rec("split", 201, 205, 201), _rec("combine", 205.2, 207, 201)],
                     joins=[])
    a, b = cupti.call_facts(tr, 2, cupti.main_stream_of(tr), lead=[2, 2])
    assert a.span_us == pytest.approx(3.0) and b.span_us == pytest.approx(6.0)
    assert not a.host_bound and not b.host_bound
    assert cupti.call_facts(tr, 2, None)[1].span_us == pytest.approx(66.0)   # without lead the flush counts


def test_graph_output_must_match_the_call():
    import torch

    from kopt.timing.cuda import same_output

    ref = torch.randn(4, 8, dtype=torch.float16)
    assert same_output(ref.clone(), ref, torch)
    assert not same_output(ref * 1.5 + 1, ref, torch)
    stale = ref.clone()
    stale[0, 0] = float("nan")                          # an element the replay left poisoned
    assert not same_output(stale, ref, torch)
    assert not same_output(ref[:2], ref, torch) and not same_output(ref, None, torch)


def _fake_timer(replay="graph", capture=None):
    from kopt.timing.cuda import CudaTimer

    t = CudaTimer.__new__(CudaTimer)
    t.opts = TimingOptions.for_device("cuda", replay=replay)
    t.cold, t.cupti, t._flush, t.replay, t.replay_note, t._eager_of = True, True, None, None, "", {}
    t.torch = type("T", (), {"cuda": type("C", (), {"synchronize": staticmethod(lambda d=None: None)})})()
    t.dev = "cuda"
    t._call_ms, t._host_us = {}, {}
    t._estimate = lambda h: None
    t._capture = capture or (lambda fn: (timing.Rotation([fn]), ""))
    return t


def test_pair_replays_both_as_graphs_or_neither():
    a, b = (lambda: 1), (lambda: 2)
    t = _fake_timer()
    ha, hb = t.prepare_all([a, b], ("candidate", "baseline"))
    assert t.replay == "graph" and t.replay_note == "" and ha is not a and hb is not b
    assert t._eager_of[id(ha)] is a and t._eager_of[id(hb)] is b   # the eager figure runs the calls themselves
    t = _fake_timer(capture=lambda fn: (None, "not capturable as a CUDA graph (RuntimeError: sync)") if fn is b
                    else (timing.Rotation([fn]), ""))
    assert t.prepare_all([a, b], ("candidate", "baseline")) == [a, b]
    assert t.replay == "stream" and t.replay_note.startswith("baseline: not capturable") and not t._eager_of
    t = _fake_timer(replay="stream", capture=lambda fn: pytest.fail("stream replay never captures"))
    assert t.prepare_all([a]) == [a] and t.replay == "stream" and t.replay_note == ""


def test_each_round_replays_fresh_captures():
    a = timing.Rotation([lambda: 1, lambda: 2])
    t = _fake_timer()
    made = []

    class G:
        def replay(self):
            return None

    def graphs(calls):
        made.append(len(calls))
        return [G() for _ in calls], [None] * len(calls)

    t._graphs = graphs
    (h,) = t.prepare_all([a])
    t._call_ms[id(h)], t._host_us[id(h)] = 0.01, 30.0
    h2 = t.again(h)
    assert h2 is not h and made == [2] and len(h2.calls) == 2
    assert t._eager_of[id(h2)] is a and t._call_ms[id(h2)] == 0.01 and t._host_us[id(h2)] == 30.0
    s = _fake_timer(replay="stream")
    (f,) = s.prepare_all([a])
    assert s.again(f) is f                                  # on the stream a round reuses the call


def test_replay_option_and_summary_fields():
    with pytest.raises(ValueError, match="unknown replay"):
        TimingOptions.for_device("cuda", replay="tape")
    assert TimingOptions.for_device("cuda").replay == "graph"
    s = Samples(dev=[0.01, 0.011, 0.012])
    st = timing.summarize(s, "cupti", True, True, 256 << 20, replay="stream", replay_note="candidate: not capturable")
    assert st.replay == "stream" and st.replay_note == "candidate: not capturable"
    host = timing.summarize(Samples(ev=[0.01, 0.02, 0.03]), "host", False, False, 0, replay="graph")
    assert host.replay is None and host.replay_note == ""   # only device-only spans are replayed


@pytest.mark.gpu
def test_gpu_graph_replay_of_a_two_kernel_call_and_its_fallbacks():
    import torch

    a = torch.randn(1 << 20, device="cuda")
    b = torch.randn(1 << 20, device="cuda")
    two = lambda: a * 1.0001 + b  # noqa: E731  (two kernels, a fresh output, as a decode call returns)
    opts = TimingOptions.for_device("cuda", quick=True)
    st = timing.time_fn(two, "cuda", opts)
    assert st.device_only and st.replay == "graph" and st.replay_note == "", st.replay_note
    assert st.eager_median_ms is not None and st.host_bound == 0
    # A host sync inside the call cannot be captured: both sides of the pair run on the stream, and why.
    synced = lambda: (a * 1.0001 + b, float(b[0].item()))  # noqa: E731
    pt = timing.time_pair(synced, two, "cuda", opts)
    assert pt.a.replay == pt.b.replay == "stream" and pt.a.replay_note.startswith("candidate: not capturable")
    # A call that launches less while captured is not timed by its replay.
    def sly():
        x = a * 1.0001
        return x if torch.cuda.is_current_stream_capturing() else x + b
    st = timing.time_fn(sly, "cuda", opts)
    assert st.replay == "stream" and "other kernels" in st.replay_note, st.replay_note
    # One that launches the same kernels on other inputs while captured: its output gives it away.
    z = torch.zeros_like(b)
    def swapped():
        return a * 1.0001 + (z if torch.cuda.is_current_stream_capturing() else b)
    st = timing.time_fn(swapped, "cuda", opts)
    assert st.replay == "stream" and "another output" in st.replay_note, st.replay_note
    on_stream = timing.time_fn(two, "cuda", TimingOptions.for_device("cuda", quick=True, replay="stream"))
    assert on_stream.replay == "stream" and on_stream.replay_note == ""


class _FakeTimer:
    """A timer whose rounds return given samples: round medians that disagree keep the pooled CI wide."""

    cupti, cold, flush, scale, flush_kind, replay, replay_note = True, True, 0, 1.0, None, "graph", ""

    def __init__(self, spread):
        self.spread, self.rounds, self.captures, self.seen = spread, 0, 0, {}

    def method(self, use_dev):
        return "cupti"

    def prepare_all(self, fns, labels=()):
        return list(fns)

    def again(self, h):
        self.captures += 1
        return h

    def eager(self, fns, n):
        return [Samples() for _ in fns]

    def sample(self, h, rule):
        self.rounds += 1
        k = self.seen[id(h)] = self.seen.get(id(h), 0) + 1
        base = 1.0 + (self.spread if k % 2 else 0.0)            # every other round of each side shifts
        return Samples(dev=[base * (1 + 1e-4 * i) for i in range(50)], elapsed_s=0.01)


def test_pair_adds_rounds_while_the_pooled_median_misses_the_rule(monkeypatch):
    from kopt.timing import api

    opts = TimingOptions.for_device("cuda")
    opts.stop = StopRule(min_samples=10, min_time_s=0.0, target_rel_ci=0.005, max_time_s=60.0, max_samples=60000)
    steady = _FakeTimer(0.0)
    monkeypatch.setattr(api, "_timer", lambda device, o: steady)
    api.time_pair(lambda: 1, lambda: 2, "cuda", opts)
    assert steady.rounds == 2 * opts.rounds                 # the rounds agree: no more of them
    shifting = _FakeTimer(0.2)
    monkeypatch.setattr(api, "_timer", lambda device, o: shifting)
    pt = api.time_pair(lambda: 1, lambda: 2, "cuda", opts)
    assert shifting.rounds == 2 * api.MORE_ROUNDS * opts.rounds   # wide pooled CI: up to the bound
    assert shifting.captures == shifting.rounds - 2          # fresh captures for every round after the first
    assert len(pt.ratios) == api.MORE_ROUNDS * opts.rounds
    opts.stop.max_samples = 600                               # the rule's sample cap ends it sooner
    capped = _FakeTimer(0.2)
    monkeypatch.setattr(api, "_timer", lambda device, o: capped)
    api.time_pair(lambda: 1, lambda: 2, "cuda", opts)
    assert capped.rounds == 2 * 12                            # 12 rounds x 50 samples reach the cap of 600


def test_pair_in_one_session_without_the_eager_figure(monkeypatch):
    # Tuning times its finalists with eager_calls=0: one session for every round and no eager segments.
    from kopt.timing import api

    class OneSession(_FakeTimer):
        def sample_all(self, fns, rule, eager=0):
            assert eager == 0
            return [Samples(dev=[1.0 + 1e-4 * i for i in range(50)], elapsed_s=0.01) for _ in fns]

    opts = TimingOptions.for_device("cuda")
    opts.eager_calls = 0
    t = OneSession(0.0)
    monkeypatch.setattr(api, "_timer", lambda device, o: t)
    pt = api.time_pair(lambda: 1, lambda: 2, "cuda", opts)
    assert len(pt.ratios) == opts.rounds and pt.a.eager_median_ms is None and pt.b.eager_median_ms is None


def test_host_pairs_of_slow_calls_take_fewer_rounds():
    """A pair whose calls overrun the time cap keeps MIN_ROUNDS rounds; a fast pair keeps the device's rounds."""
    from kopt.timing.host import MIN_ROUNDS, HostTimer

    opts = TimingOptions.for_device("cpu")
    t = HostTimer(opts)
    t.call_s = [0.01, 0.2]
    assert t.pair_rounds(opts) == opts.rounds
    t.call_s = [0.5, 8.0]
    assert t.pair_rounds(opts) == MIN_ROUNDS
