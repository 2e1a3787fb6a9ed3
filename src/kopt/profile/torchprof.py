"""The always-available fallback: a torch.profiler (kineto) chrome trace of a few calls.

The target runs in a child process (`--export-trace`), so a crashing candidate cannot take kopt
down and the trace holds only the profiled calls. On CUDA the trace has device kernels with their
launch geometry (kineto args: grid, block, registers per thread, shared memory); on the CPU it has
host ops only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from kopt.profile.common import ProfileError, TargetSpec, run_logged, tail_lines, target_error
from kopt.profile.models import KernelMetrics
from kopt.profile.trace import TraceSummary, summarize_file

TRACE_NAME = "trace.json"


@dataclass
class TorchRun:
    """A kineto trace, its summary and the command that wrote it."""

    trace: Path
    summary: TraceSummary
    command: list[str]


def run(spec: TargetSpec, out_dir: Path, calls: int = 3, timeout_s: float = 600.0,
        units: Optional[int] = None) -> TorchRun:
    """Run the target under torch.profiler and summarize the trace it wrote."""
    trace = out_dir / TRACE_NAME
    argv = TargetSpec(**{**spec.__dict__, "extra": [*spec.extra, "--export-trace", str(trace),
                                                     "--calls", str(calls)]}).argv()
    p = run_logged(argv, out_dir / "target.log", timeout_s)
    if p.timed_out:
        raise ProfileError(f"the profiled target timed out after {timeout_s:.0f} s (raise --timeout)")
    if p.rc != 0 or not trace.is_file():
        why = target_error(p.output) or tail_lines(p.output)
        raise ProfileError(f"the profiled target failed (status {p.rc}): {why}")
    return TorchRun(trace, summarize_file(trace, units=units), argv)


def kernels_from_timeline(s: TraceSummary) -> list[KernelMetrics]:
    """Per-kernel metrics a timeline can give: mean duration and, for device kernels, launch geometry."""
    from kopt.profile.geometry import prod

    if s.event_kind != "device kernels":
        return []
    calls = len(s.calls) or None
    out = []
    for r in s.kernels:
        per_call = r.count / calls if calls else 1
        m = {"duration_ns": r.mean_us * 1e3 * per_call if calls else r.mean_us * 1e3,
             "grid_size": prod(r.grid), "block_size": prod(r.block), "registers_per_thread": r.registers,
             "smem_static_bytes": r.smem_bytes}
        if r.tail and r.tail.get("waves") is not None:
            m["est_waves"] = r.tail["waves"]
        k = KernelMetrics(name=r.name, metrics={a: float(v) for a, v in m.items() if v is not None})
        k.missing = {"counters": "a timeline has no hardware counters (use --tool ncu / mcprofiler)"}
        out.append(k)
    return out
