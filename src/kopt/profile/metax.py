"""MetaX adapters: mcProfiler (hardware counters) and mcTracer (timeline), MACA toolchain.

UNVERIFIED: no MetaX manual was available here. The command lines and output formats below follow
public usage of the tools (MACA SDK 3.x scripts and reports), and the parsers accept what those
show; check them against `mcProfiler --help` / `mcTracer --help` of the installed SDK.

- mcProfiler: `mcProfiler perf_exec --cmdline "<command>" --casename NAME --metrics "M1" "M2" ...
  --counts 1 --custom --per-kernel --cwd DIR [--kernelname K]`; its log names the report folder
  (`[info] output path is: <dir>`), which holds `report.txt.json` (and `<...><kernel>.txt.json`
  per kernel): `{"<section>": [{"name": "L2C Hit Rate", "value": "71.2%"}, ...]}`; a "dumped"
  variant uses "data" instead of "value". Chart entries carry a dict value.
  kopt also writes the metric list to mcprofiler_config.json next to the report, for the record.
- mcTracer: `mcTracer --mctx --odname <dir> <command...>` (the folder is taken relative to the
  working directory) writes `<dir>/tracer_out-<pid>.json`, a chrome trace; launches are complete
  events whose args hold grid/block dicts, `mem` (registers_per_thread, static_shared,
  dynamic_shared, ...) and "mtreg_occupancy(%)" / "shared_memory_occupancy(%)"; ts/dur reported in ns.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path
from typing import Optional

from kopt.profile.common import ProfileError, run_logged, tail_lines, target_error
from kopt.profile.models import KernelMetrics

#: kopt short name -> mcProfiler metric name (names as public C500 reports print them).
METRICS: dict[str, str] = {
    "l2_hit_pct": "L2C Hit Rate",
    "vl1_hit_pct": "VL1 Hit Rate",
    "dram_read_bytes": "Global Memory Read bytes",
    "dram_write_bytes": "Global Memory Write bytes",
    "tensor_pct": "AP MMA Duty ratio",
    "mte_duty_pct": "AP MTE Duty ratio",
    "ste_duty_pct": "AP STE Duty ratio",
    "vls_duty_pct": "VLS Duty ratio",
    "l2c_duty_pct": "L2C Duty ratio",
    "achieved_waves": "Achieved waves",
    "dispatched_waves": "Dispatched waves",
    "wave_life_cycles": "Average Wave life cycles",
    "total_cycles": "Total Cycles",
    "ipc": "instruction per cycle",
    "smem_efficiency_pct": "shared memory access efficiency",
    "smem_conflict_cycles": "average conflict cycles per instruction",
    "load_latency_cycles": "average latency per load instruction",
    "dnoc_read_latency_cycles": "Dnoc Read Average Latency",
}
#: Chart-valued metric: C500 issue-unit stall cycles by category (a dict), not NVIDIA stall reasons.
ISU_STALLS = "ISU stall cycles layout"
_OUT_PATH = re.compile(r"output path is:\s*(\S+)")
_NUM = re.compile(r"^\s*([-+]?[\d,]*\.?\d+(?:[eE][-+]?\d+)?)\s*([A-Za-z%]*)")
_SIZE = {"": 1, "b": 1, "byte": 1, "bytes": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 1024, "mib": 1 << 20,
         "gib": 1 << 30}


def find_mcprofiler() -> Optional[str]:
    """Path of mcProfiler, or None."""
    return shutil.which("mcProfiler")


def find_mctracer() -> Optional[str]:
    """Path of mcTracer, or None."""
    return shutil.which("mcTracer")


def mcprofiler_command(tool: str, target_argv: list[str], casename: str, cwd: Path,
                       metrics: Optional[list[str]] = None, kernel_name: Optional[str] = None,
                       counts: int = 1) -> list[str]:
    """mcProfiler perf_exec command line (UNVERIFIED, see the module docstring)."""
    cmd = [tool, "perf_exec", "--cmdline", shlex.join(target_argv), "--casename", casename,
           "--metrics", *(metrics or [*METRICS.values(), ISU_STALLS]), "--counts", str(counts), "--custom",
           "--per-kernel", "--cwd", str(cwd)]
    return cmd + (["--kernelname", kernel_name] if kernel_name else [])


def mctracer_command(tool: str, target_argv: list[str], odname: str = "mctracer") -> list[str]:
    """mcTracer command line (UNVERIFIED): the output folder is relative to the working directory."""
    return [tool, "--mctx", "--odname", odname, *target_argv]


def parse_value(v) -> Optional[float]:
    """'71.2%' -> 71.2, '1,024 byte' -> 1024.0, '2 KB' -> 2000.0; None when not a number."""
    if isinstance(v, (int, float)):
        return float(v)
    m = _NUM.match(str(v or ""))
    if not m:
        return None
    x = float(m.group(1).replace(",", ""))
    unit = m.group(2).lower()
    return x * _SIZE[unit] if unit in _SIZE else x


def parse_report(data: dict, name: str = "kernel") -> KernelMetrics:
    """One mcProfiler report JSON ({section: [{name, value|data}]}) -> curated metrics."""
    by_name = {v: k for k, v in METRICS.items()}
    k = KernelMetrics(name=name)
    for _section, entries in data.items():
        if not isinstance(entries, list):
            continue
        for e in entries:
            if not isinstance(e, dict) or "name" not in e:
                continue
            val = e.get("value", e.get("data"))
            if isinstance(val, dict):
                chart = val.get("data", val) if isinstance(val.get("data"), dict) else val
                k.raw[e["name"]] = json.dumps(chart)
                if e["name"] == ISU_STALLS:
                    for cat, cyc in chart.items():
                        k.metrics[f"isu_stall_{re.sub(r'[^a-z0-9]+', '_', str(cat).lower()).strip('_')}"] = \
                            parse_value(cyc)
                continue
            k.raw[e["name"]] = str(val)
            if e["name"] in by_name:
                k.metrics[by_name[e["name"]]] = parse_value(val)
    rd, wr = k.metrics.get("dram_read_bytes"), k.metrics.get("dram_write_bytes")
    if rd is not None or wr is not None:
        k.metrics["dram_bytes"] = (rd or 0.0) + (wr or 0.0)
    for short in METRICS:
        if k.metrics.get(short) is None:
            k.metrics.pop(short, None)
            k.missing[short] = "not in the mcProfiler report"
    return k


def tracer_kernels(data: dict, time_unit: str = "ns") -> list[KernelMetrics]:
    """Launch geometry and mean duration per kernel name from an mcTracer trace."""
    from kopt.profile.geometry import prod
    from kopt.profile.trace import is_kernel

    scale = 1.0 if time_unit == "ns" else 1e3
    groups: dict[str, list[dict]] = {}
    for e in data.get("traceEvents", []):
        if isinstance(e, dict) and e.get("ph") == "X" and is_kernel(e):
            groups.setdefault(str(e.get("name", "?")), []).append(e)
    out = []
    for name, evs in groups.items():
        a = evs[0].get("args") or {}
        mem = a.get("mem") if isinstance(a.get("mem"), dict) else {}
        k = KernelMetrics(name=name)
        durs = [e["dur"] for e in evs if isinstance(e.get("dur"), (int, float))]
        m = {"duration_ns": sum(durs) / len(durs) * scale if durs else None,
             "grid_size": prod(a.get("grid")), "block_size": prod(a.get("block")),
             "registers_per_thread": mem.get("registers_per_thread"), "smem_static_bytes": mem.get("static_shared"),
             "smem_dynamic_bytes": mem.get("dynamic_shared")}
        occ = [parse_value(a.get(x)) for x in ("mtreg_occupancy(%)", "shared_memory_occupancy(%)")]
        occ = [o for o in occ if o]
        m["theoretical_occupancy_pct"] = min(occ) if occ else None
        k.metrics = {key: float(v) for key, v in m.items() if v is not None}
        k.raw = {key: json.dumps(v) if isinstance(v, (dict, list)) else str(v) for key, v in a.items()}
        out.append(k)
    return sorted(out, key=lambda k: -(k.metrics.get("duration_ns") or 0.0))


def run_mcprofiler(tool: str, out_dir: Path, target_argv: list[str], casename: str, timeout_s: float = 600.0,
                   kernel_name: Optional[str] = None) -> tuple[list[KernelMetrics], list[str], list[list[str]]]:
    """Run mcProfiler, copy its report folder under out_dir, parse every report JSON in it."""
    log = out_dir / "mcprofiler.log"
    metrics = [*METRICS.values(), ISU_STALLS]
    (out_dir / "mcprofiler_config.json").write_text(json.dumps(
        {"metrics": metrics, "counts": 1, "per_kernel": True, "kernel_name": kernel_name,
         "note": "UNVERIFIED command line; see kopt.profile.metax"}, indent=2))
    cmd = mcprofiler_command(tool, target_argv, casename, out_dir, metrics, kernel_name)
    p = run_logged(cmd, log, timeout_s, cwd=out_dir)
    if p.timed_out:
        raise ProfileError(f"mcProfiler timed out after {timeout_s:.0f} s (raise --timeout); log: {log.name}")
    if target_error(p.output):
        raise ProfileError(f"the profiled target failed: {target_error(p.output)}")
    found = _OUT_PATH.findall(p.output)
    if p.rc != 0 or not found:
        raise ProfileError(f"mcProfiler exited with status {p.rc} and no report path: {tail_lines(p.output)} "
                           f"(log: {log.name})")
    src = Path(found[-1])
    src = src if src.is_absolute() else out_dir / src
    dest = out_dir / "mcprofiler_report"
    shutil.copytree(src, dest, dirs_exist_ok=True)
    kernels = []
    for f in sorted(dest.rglob("*.json")):
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and any(isinstance(v, list) for v in data.values()):
            kernels.append(parse_report(data, name=f.name.removesuffix(".txt.json").removesuffix(".json")))
    if not kernels:
        raise ProfileError(f"mcProfiler report {src} holds no parsable report JSON")
    files = [log.name, "mcprofiler_config.json"] + [str(f.relative_to(out_dir)) for f in sorted(dest.rglob("*.json"))]
    return kernels, files, [cmd]


def run_mctracer(tool: str, out_dir: Path, target_argv: list[str], timeout_s: float = 600.0) -> tuple[Path,
                                                                                                      list[list[str]]]:
    """Run mcTracer in out_dir; returns the trace it wrote (newest tracer_out-*.json) and the command."""
    log = out_dir / "mctracer.log"
    cmd = mctracer_command(tool, target_argv)
    p = run_logged(cmd, log, timeout_s, cwd=out_dir)
    if p.timed_out:
        raise ProfileError(f"mcTracer timed out after {timeout_s:.0f} s (raise --timeout); log: {log.name}")
    if target_error(p.output):
        raise ProfileError(f"the profiled target failed: {target_error(p.output)}")
    traces = sorted(out_dir.rglob("tracer_out-*.json"), key=lambda f: f.stat().st_mtime)
    if not traces:
        raise ProfileError(f"mcTracer wrote no tracer_out-*.json (status {p.rc}: {tail_lines(p.output)}; log: "
                           f"{log.name})")
    return traces[-1], [cmd]
