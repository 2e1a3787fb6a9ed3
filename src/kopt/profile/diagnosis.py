"""The six-dimension diagnosis, scored ok / watch / limiting, mapped to checklist pattern letters.

Dimensions and letters follow knowledge/profiling/diagnosis_checklist.md (patterns A-N). The
rules read kopt's short metric names (kopt.profile.ncu.METRICS; mcProfiler/mcTracer and a kineto
timeline fill the subset they can). A dimension without evidence is NA with the reason.

Thresholds (from the checklist): waves < ~0.8 or grid < units -> A; DRAM < ~80 % of peak with
long-scoreboard on top and a full grid -> B; a partial last wave idling > 10 % / 25 % of the slots
-> C watch / limiting, and the same bands for the idle share the plan leaves on the case's lengths
(busiest unit vs the mean); a second kernel >= 25 % of the call -> D; reads > 1.05x the K/V bytes -> I;
instruction and constant fetch (no_instruction + imc_miss) >= FETCH_WATCH_PCT of the stalls -> N.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from kopt.profile.geometry import Balance
from kopt.profile.models import Diagnosis, Dimension, KernelMetrics, Score

_RANK = {Score.na: -1, Score.ok: 0, Score.watch: 1, Score.limiting: 2}
TITLES = {"occupancy": "occupancy & launch geometry", "tail": "tail effect", "stalls": "stall breakdown",
          "tensor": "tensor-core utilization", "timeline": "SM timeline", "memory": "memory bandwidth"}
#: Below this many bytes per call a kernel cannot approach DRAM bandwidth (launch/latency bound).
TINY_BYTES = 4 << 20
#: Stall reasons of the instruction and constant fetch (pattern N): together from this share of the stalls, a
#: finding of their own whichever single reason leads (H200, case 5's one-tile kernel: 32%).
FETCH_STALLS = ("no_instruction", "imc_miss")
FETCH_WATCH_PCT = 25.0


@dataclass
class Evidence:
    """Everything the rules may read."""

    kernels: list[KernelMetrics] = field(default_factory=list)
    timeline: Optional[object] = None
    """kopt.profile.trace.TraceSummary of a few calls, when one was taken."""
    units: Optional[int] = None
    unit_name: str = "SM"
    vendor: str = "nvidia"
    source: str = ""
    kv_bytes: Optional[int] = None
    out_bytes: Optional[int] = None
    ideal_bytes: Optional[int] = None
    copy_ceiling_gbps: Optional[float] = None
    paged: bool = False
    balance: Optional[Balance] = None
    """The plan's work per unit on the case's lengths (kopt.profile.geometry.plan_balance)."""
    balance_na: str = ""
    """Why `balance` is None (no plan recorded, a plan without block_N / num_splits...)."""
    native_cpu: bool = False
    """A CPU run of compiled code (the tilelang C target), not of torch ops: the torch profiler's timeline sees
    its work only as gaps between ops (a torch candidate keeps the timeline dimension: its ops are its work)."""


@dataclass
class _Finding:
    score: Score
    text: str
    patterns: tuple = ()


def dominant(kernels: list[KernelMetrics]) -> Optional[KernelMetrics]:
    """The kernel with the longest duration (the first when none has one)."""
    if not kernels:
        return None
    return max(kernels, key=lambda k: k.metrics.get("duration_ns") or -1.0)


def _dim(key: str, findings: list[_Finding], evidence: dict, na_reason: str = "") -> Dimension:
    ev = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in evidence.items() if v is not None}
    if not findings:
        return Dimension(key=key, title=TITLES[key], score=Score.na, evidence=ev, reason=na_reason or "no evidence")
    top = max((f.score for f in findings), key=_RANK.get)
    pats = sorted({p for f in findings for p in f.patterns})
    shown = [f for f in findings if f.score == top] + [f for f in findings if f.score != top]
    return Dimension(key=key, title=TITLES[key], score=top, evidence=ev, patterns=pats,
                     reason="; ".join(f.text for f in shown))


def _roofline_cap(findings: list[_Finding], k: Optional[KernelMetrics]) -> list[_Finding]:
    """With DRAM already >= 80 % of peak, geometry is not the limiter: limiting becomes watch."""
    dram = k.metrics.get("dram_pct") if k else None
    if dram is None or dram < 80:
        return findings
    return [_Finding(Score.watch, f.text + f" (DRAM already at {dram:.0f}% of peak)", f.patterns)
            if f.score == Score.limiting else f for f in findings]


def _waves(ev: Evidence, k: KernelMetrics) -> Optional[float]:
    m = k.metrics
    if m.get("waves_per_sm") is not None:
        return m["waves_per_sm"]
    limits = [m.get(x) for x in ("limit_blocks", "limit_registers", "limit_shared_mem", "limit_warps")]
    limits = [x for x in limits if x]
    if m.get("grid_size") and ev.units and limits:
        return m["grid_size"] / (ev.units * min(limits))
    return m.get("est_waves")


def occupancy(ev: Evidence, k: Optional[KernelMetrics]) -> Dimension:
    """Dimension 1: grid vs units, achieved occupancy, what limits residency, spills."""
    if k is None:
        return _dim("occupancy", [], {}, "no kernel launch recorded (a CPU run has no grid)")
    m, f = k.metrics, []
    grid, units = m.get("grid_size"), ev.units
    gpu = grid / units if grid and units else None
    smem = (m.get("smem_static_bytes") or 0) + (m.get("smem_dynamic_bytes") or 0) if (
        m.get("smem_static_bytes") is not None or m.get("smem_dynamic_bytes") is not None) else None
    evidence = {"grid": grid, "block": m.get("block_size"), "units": units, "grid_per_unit": gpu,
                "registers_per_thread": m.get("registers_per_thread"), "smem_per_block_bytes": smem,
                "achieved_occupancy_pct": m.get("achieved_occupancy_pct"),
                "theoretical_occupancy_pct": m.get("theoretical_occupancy_pct"),
                "limit_registers": m.get("limit_registers"), "limit_shared_mem": m.get("limit_shared_mem"),
                "local_load_bytes": m.get("local_load_bytes")}
    if gpu is not None:
        if gpu < 1:
            # A few idle units (grid 128 on 132 SMs) cost little; a half-empty machine is pattern A.
            f.append(_Finding(Score.limiting if gpu < 0.8 else Score.watch, f"grid {grid:.0f} < {units} "
                              f"{ev.unit_name}s: {100 * (1 - gpu):.0f}% of the units get no block", ("A",)))
        else:
            f.append(_Finding(Score.ok, f"grid {grid:.0f} = {gpu:.2f} blocks per {ev.unit_name}"))
    if (m.get("local_load_bytes") or 0) > 0:
        f.append(_Finding(Score.limiting, f"local-memory loads {m['local_load_bytes']:.0f} B: register spills", ("F",)))
    elif (m.get("registers_per_thread") or 0) >= 255:
        f.append(_Finding(Score.watch, "255 registers per thread: spill risk", ("F",)))
    lim = {x: m.get(f"limit_{x}") for x in ("registers", "shared_mem", "warps", "blocks") if m.get(f"limit_{x}")}
    occ = m.get("achieved_occupancy_pct")
    if lim and min(lim, key=lim.get) == "shared_mem" and lim["shared_mem"] <= 1:
        f.append(_Finding(Score.limiting if occ is not None and occ < 20 else Score.watch,
                          "shared memory limits residency to 1 block per unit", ("G",)))
    if occ is not None:
        if occ < 15 and (gpu is None or gpu >= 1):
            f.append(_Finding(Score.watch, f"achieved occupancy {occ:.1f}%: few warps to hide latency", ("B",)))
        elif occ >= 15:
            f.append(_Finding(Score.ok, f"achieved occupancy {occ:.1f}%"))
    return _dim("occupancy", _roofline_cap(f, k), evidence, "launch geometry and occupancy were not recorded")


def tail(ev: Evidence, k: Optional[KernelMetrics]) -> Dimension:
    """Dimension 2: the fractional last wave (launch geometry), and the work of the busiest unit vs the
    mean from the plan and the lengths (a ragged batch's long rows leave most units idle)."""
    f, evidence, na = _wave_tail(ev, k)
    b = ev.balance
    if b is not None:
        evidence.update(plan=b.plan, plan_ctas=b.ctas, busiest_unit_keys=b.busiest_keys, mean_unit_keys=b.mean_keys,
                        plan_imbalance=b.imbalance, plan_idle_pct=b.idle_pct)
        s = Score.limiting if b.idle_pct > 25 else Score.watch if b.idle_pct > 10 else Score.ok
        pat = ("A",) if b.ctas < b.units else ("C",)
        f += _roofline_cap([_Finding(s, f"plan and lengths: the busiest {ev.unit_name} reads {b.imbalance:.2f}x "
                                        f"the mean keys ({b.ctas} CTAs on {b.units}; {b.idle_pct:.0f}% of the "
                                        f"{ev.unit_name}-time idle)", pat if s != Score.ok else ())], k)
    elif ev.balance_na:
        na = f"{na}; plan-based balance NA: {ev.balance_na}" if na else f"plan-based balance NA: {ev.balance_na}"
    return _dim("tail", f, evidence, na)


def _wave_tail(ev: Evidence, k: Optional[KernelMetrics]) -> tuple[list[_Finding], dict, str]:
    """The launch-geometry half of the tail dimension: (findings, evidence, why NA)."""
    if k is None:
        return [], {}, "no kernel launch recorded"
    w, grid = _waves(ev, k), k.metrics.get("grid_size")
    evidence = {"waves": w, "grid": grid, "units": ev.units}
    if w is None:
        if grid and ev.units and grid < ev.units:
            return [_Finding(Score.limiting, f"one partial wave: {grid:.0f} blocks on {ev.units} "
                                             f"{ev.unit_name}s", ("A",))], evidence, ""
        return [], evidence, "waves unknown: resident blocks per unit not recorded"
    if w < 1:
        s = Score.limiting if w < 0.8 else Score.ok
        return _roofline_cap([_Finding(s, f"{w:.2f} waves: a single partial wave, {100 * w:.0f}% of the slots "
                                          "busy", ("A",) if s != Score.ok else ())], k), evidence, ""
    total = math.ceil(w)
    idle = 100.0 * (total - w) / total
    evidence.update(last_wave_fraction=w - math.floor(w) or 1.0, idle_slot_pct=idle)
    s = Score.limiting if idle > 25 else Score.watch if idle > 10 else Score.ok
    return _roofline_cap([_Finding(s, f"{w:.2f} waves: the last wave leaves {idle:.0f}% of all slot-waves idle",
                                   ("C",) if s != Score.ok else ())], k), evidence, ""


def stalls(ev: Evidence, k: Optional[KernelMetrics]) -> Dimension:
    """Dimension 3: the dominant warp stall reason and what it points to."""
    m = k.metrics if k else {}
    st = {n[6:]: v for n, v in m.items() if n.startswith("stall_") and v is not None and v > 0}
    if not st:
        isu = {n[10:]: v for n, v in m.items() if n.startswith("isu_stall_") and v}
        if isu:
            top, tot = max(isu, key=isu.get), sum(isu.values())
            share = 100 * isu[top] / tot
            ev_ = {"top_isu_stall": top, "top_share_pct": share, "dnoc_read_latency_cycles": m.get(
                "dnoc_read_latency_cycles"), "l2_hit_pct": m.get("l2_hit_pct")}
            return _dim("stalls", [_Finding(Score.watch if share > 50 else Score.ok,
                                            f"C500 issue-unit stalls led by {top} ({share:.0f}%): an approximate "
                                            "proxy, not NVIDIA stall reasons")], ev_)
        return _dim("stalls", [], {}, "stall reasons need hardware counters (ncu / mcProfiler); a timeline has none")
    tot = sum(st.values())
    shares = sorted(((r, 100 * v / tot) for r, v in st.items()), key=lambda x: -x[1])
    top, share = shares[0]
    evidence = {f"{r}_pct": s for r, s in shares[:4]}
    evidence["warp_cycles_per_issue"] = m.get("warp_cycles_per_issue")
    dram, w = m.get("dram_pct"), _waves(ev, k)
    small_grid = (w is not None and w < 0.8) or (m.get("grid_size") and ev.units and m["grid_size"] < ev.units)
    what = f"{top} leads the stalls ({share:.0f}%)"
    if top == "long_scoreboard":
        if dram is not None and dram >= 80:
            f = _Finding(Score.ok, what + f" with DRAM at {dram:.0f}% of peak: waiting on memory is expected")
        elif small_grid:
            f = _Finding(Score.limiting, what + ": too few blocks to keep loads in flight", ("A", "B"))
        else:
            f = _Finding(Score.limiting if share >= 40 else Score.watch,
                         what + (f" with DRAM at {dram:.0f}%" if dram is not None else "") +
                         ": too few bytes in flight per unit", ("B",))
    elif top in ("short_scoreboard", "mio_throttle"):
        f = _Finding(Score.limiting if share >= 40 else Score.watch, what + ": shared-memory / MIO pressure", ("E",))
    elif top in ("math_pipe_throttle", "wait"):
        f = _Finding(Score.limiting if share >= 40 and (m.get("sm_pct") or 0) >= 60 else Score.watch,
                     what + ": instruction-bound math", ("K",))
    elif top == "lg_throttle":
        f = _Finding(Score.watch, what + ": many small global loads (use 16-B vector loads)", ("B",))
    else:
        f = _Finding(Score.watch if share >= 30 else Score.ok, what)
    found = [f]
    fetch = sum(s for r, s in shares if r in FETCH_STALLS)
    if fetch >= FETCH_WATCH_PCT:
        evidence["fetch_pct"] = fetch
        found.append(_Finding(Score.watch, f"instruction and constant fetch {fetch:.0f}% of the stalls (no_instruction "
                                           "+ imc_miss): code and parameters fetched cold, a long instruction stream",
                              ("N",)))
    return _dim("stalls", found, evidence)


def tensor(ev: Evidence, k: Optional[KernelMetrics]) -> Dimension:
    """Dimension 4: tensor-core (MMA) pipe use, judged against whether the kernel is memory-bound."""
    m = k.metrics if k else {}
    t = m.get("tensor_pct")
    busy = m.get("sm_pct") if m.get("sm_pct") is not None else m.get("mte_duty_pct")
    evidence = {"tensor_pct": t, "tensor_inst": m.get("tensor_inst"), "sm_pct": m.get("sm_pct"),
                "mte_duty_pct": m.get("mte_duty_pct"), "dram_pct": m.get("dram_pct")}
    if t is None:
        return _dim("tensor", [], evidence, "tensor-pipe counters need ncu or mcProfiler")
    dram = m.get("dram_pct")
    if t >= 5:
        return _dim("tensor", [_Finding(Score.ok, f"tensor pipe active {t:.1f}% of cycles")], evidence)
    if busy is not None and busy >= 60 and (dram is None or dram < 60):
        return _dim("tensor", [_Finding(Score.limiting, f"tensor pipe {t:.1f}% while the SM is {busy:.0f}% busy: "
                                        "QK/PV on CUDA cores", ("K",))], evidence)
    if dram is not None and dram >= 60:
        return _dim("tensor", [_Finding(Score.ok, f"tensor pipe {t:.1f}%: expected in a memory-bound "
                                                  f"kernel")], evidence)
    return _dim("tensor", [_Finding(Score.watch, f"tensor pipe {t:.1f}% (not memory-bound either)", ("K",))], evidence)


def timeline(ev: Evidence, k: Optional[KernelMetrics]) -> Dimension:
    """Dimension 5: kernels per call, a dominant second kernel (combine), gaps between kernels."""
    f, evidence = [], {}
    durs = sorted(((x.name, x.metrics.get("duration_ns")) for x in ev.kernels if x.metrics.get("duration_ns")),
                  key=lambda t: -t[1])
    tl = ev.timeline
    cs = tl.call_stats() if tl is not None else {}
    if cs and ev.native_cpu:  # the C kernel is no torch op: its own run shows as the "gap" between host ops
        evidence.update(kernels_per_call=cs["kernels_per_call"], call_span_us=cs["span_us"], busy_us=cs["busy_us"],
                        event_kind=tl.event_kind)
        return _dim("timeline", [], evidence, CPU_TIMELINE_NA)
    if cs:
        evidence.update(kernels_per_call=cs["kernels_per_call"], call_span_us=cs["span_us"], busy_us=cs["busy_us"],
                        gap_pct=cs["gap_pct"], event_kind=tl.event_kind)
        g = cs["gap_pct"]
        s = Score.limiting if g >= 20 else Score.watch if g >= 10 else Score.ok
        f.append(_Finding(s, f"{g:.0f}% of each call is gaps between {tl.event_kind} "
                          f"({cs['kernels_per_call']:.0f} per call)", ("H",) if s != Score.ok else ()))
        if tl.event_kind != "device kernels":
            durs = []                       # host ops: no main/combine kernel split to judge
        elif tl.kernels and tl.calls:
            durs = [(r.name, r.total_us * 1e3 / len(tl.calls)) for r in tl.kernels]
    if len(durs) >= 2:
        total = sum(d for _, d in durs)
        name2, d2 = durs[1]
        share = 100 * d2 / total
        evidence.update(second_kernel=name2[:60], second_kernel_pct=share)
        if share >= 25:
            f.append(_Finding(Score.limiting, f"second kernel {name2[:40]} takes {share:.0f}% of the call", ("D",)))
        elif len(durs) > 2 or share >= 10:
            f.append(_Finding(Score.watch, f"{len(durs)} kernels per call", ("H",)))
    elif len(durs) == 1:
        f.append(_Finding(Score.ok, "one kernel per call"))
    act = k.metrics.get("sm_active_pct") if k else None
    if act is not None:
        evidence["sm_active_pct"] = act
        if act < 60:
            f.append(_Finding(Score.watch, f"SMs active {act:.0f}% of the kernel's time", ("A", "C")))
    return _dim("timeline", f, evidence, "no timeline and no per-kernel durations")


#: Why the timeline and memory dimensions do not apply to a CPU run (its kernel is serial C code on the host).
CPU_TIMELINE_NA = ("a CPU run: the C kernel's own work is not a torch op, so the timeline's gaps between torch ops are "
                   "the kernel itself, not launches; nothing here is launch-bound")
CPU_MEMORY_NA = ("a CPU run: kopt measures no bandwidth ceiling on the CPU, and the serial C kernel is bound by its "
                 "own arithmetic, not by DRAM; its switch is its tile (compare configs with kopt bench --config)")


def memory(ev: Evidence, k: Optional[KernelMetrics]) -> Dimension:
    """Dimension 6: DRAM throughput vs peak (or effective GB/s vs the copy ceiling) and redundant bytes."""
    m, f = (k.metrics if k else {}), []
    if ev.vendor == "cpu":
        cs = ev.timeline.call_stats() if ev.timeline is not None else {}
        eff = ev.ideal_bytes / (cs["span_us"] * 1e3) if ev.ideal_bytes and cs.get("span_us") else None
        return _dim("memory", [], {"effective_gbps": eff, "kv_bytes": ev.kv_bytes}, CPU_MEMORY_NA)
    dur = m.get("duration_ns")
    rd, wr, tot = m.get("dram_read_bytes"), m.get("dram_write_bytes"), m.get("dram_bytes")
    achieved = tot / dur if tot and dur else None           # bytes/ns == GB/s
    eff = None
    cs = ev.timeline.call_stats() if ev.timeline is not None else {}
    if ev.ideal_bytes and cs.get("span_us"):
        eff = ev.ideal_bytes / (cs["span_us"] * 1e3)
    elif ev.ideal_bytes and dur and len(ev.kernels) == 1:
        eff = ev.ideal_bytes / dur
    pct = m.get("dram_pct")
    pct_src = "dram__throughput % of peak"
    if pct is None and ev.copy_ceiling_gbps and (achieved or eff):
        pct, pct_src = 100 * (achieved or eff) / ev.copy_ceiling_gbps, "% of the measured copy ceiling"
    evidence = {"dram_pct": m.get("dram_pct"), "achieved_gbps": achieved, "effective_gbps": eff,
                "copy_ceiling_gbps": ev.copy_ceiling_gbps, "pct_used": pct, "dram_read_bytes": rd,
                "dram_write_bytes": wr, "kv_bytes": ev.kv_bytes, "l2_hit_pct": m.get("l2_hit_pct")}
    if rd and ev.kv_bytes and ev.kv_bytes >= (1 << 20):
        ratio = rd / ev.kv_bytes
        evidence["read_vs_kv"] = ratio
        if ratio > 1.05:
            f.append(_Finding(Score.limiting if ratio > 1.5 else Score.watch,
                              f"DRAM reads {ratio:.2f}x the K/V bytes: redundant reads", ("I",)))
    if wr and ev.out_bytes and wr > 2 * ev.out_bytes and wr > (1 << 20):
        f.append(_Finding(Score.watch, f"DRAM writes {wr / ev.out_bytes:.1f}x the output: split partials", ("L",)))
    if ev.ideal_bytes is not None and ev.ideal_bytes < TINY_BYTES:
        f.append(_Finding(Score.watch, f"{ev.ideal_bytes / 1024:.0f} KiB per call cannot reach DRAM bandwidth: "
                          "launch/latency bound", ("H",)))
    elif pct is not None:
        w = _waves(ev, k) if k else None
        small = (w is not None and w < 0.8) or bool(m.get("grid_size") and ev.units and m["grid_size"] < ev.units)
        pats = ("A",) if small else ("B", "J") if ev.paged else ("B",)
        s = Score.ok if pct >= 80 else Score.watch if pct >= 50 else Score.limiting
        f.append(_Finding(s, f"{pct:.0f} {pct_src}", pats if s != Score.ok else ()))
    why = (f"{eff or achieved:.0f} GB/s, but no measured copy ceiling to judge it against (run `kopt bench` once)"
           if (eff or achieved) else "no DRAM counters and no timeline to derive bandwidth from")
    return _dim("memory", f, evidence, why)


def diagnose(ev: Evidence) -> Diagnosis:
    """All six dimensions for the dominant kernel."""
    k = dominant(ev.kernels)
    dims = [fn(ev, k) for fn in (occupancy, tail, stalls, tensor, timeline, memory)]
    return Diagnosis(kernel=k.name if k else None, units=ev.units, unit_name=ev.unit_name, source=ev.source,
                     dimensions=dims)


def pattern_titles(path: Optional[Path] = None) -> dict[str, str]:
    """Letter -> title from the checklist's `### A. Title` headings ({} when the file is absent)."""
    from kopt.paths import workspace

    rel = Path("knowledge") / "profiling" / "diagnosis_checklist.md"
    # The workspace's copy first; a source checkout's own copy beside src/ otherwise.
    cands = [path] if path else [workspace() / rel, Path(__file__).resolve().parents[3] / rel]
    text = next((p.read_text() for p in cands if p.is_file()), None)
    if text is None:
        return {}
    return {m.group(1): m.group(2).strip() for m in re.finditer(r"^###\s+([A-Z])\.\s+(.+)$", text, re.M)}
