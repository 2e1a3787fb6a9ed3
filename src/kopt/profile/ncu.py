"""Nsight Compute adapter: command lines, a guarded run, CSV import and parsing.

Collection (one call of the candidate, inside the target's NVTX push/pop range `kopt_call`; the
trailing slash in `kopt_call/` is how ncu names a push/pop range):

    ncu --nvtx --nvtx-include kopt_call/ --clock-control none --target-processes all
        --launch-count 64 --section LaunchStats --section Occupancy --section SpeedOfLight
        --section WarpStateStats --metrics <METRICS> --export <dir>/report --force-overwrite
        python -m kopt.profile.target --candidate ... --case N ...

Import: `ncu --import report.ncu-rep --csv --page raw --print-units base` (one row per kernel,
one column per metric, a units row under the header). `--page details --csv` (one row per
metric) parses too. With `source` (kopt profile --source) the SourceCounters section is collected
too and `--page source --csv --print-source sass` is exported as source_sass.csv: each SASS
instruction of the profiled kernels with its warp-stall samples, sampled once every 32 cycles
(`--warp-sampling-interval 0`), of which `kopt.profile.sass.parse_source` keeps the hottest for
summary.md. Metric names follow the Nsight Compute metric reference; a name the installed ncu does
not know is dropped and the run retried, and reported NA with that reason.
"""

from __future__ import annotations

import csv
import io
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from kopt.profile.common import ProfileError, number, run_logged, tail_lines, target_error
from kopt.profile.models import HotInstruction, KernelMetrics
from kopt.profile.sass import parse_source

NVTX_INCLUDE = "kopt_call/"
SECTIONS = ("LaunchStats", "Occupancy", "SpeedOfLight", "WarpStateStats")
#: The section whose sampled warp stalls the source page shows per SASS instruction (kopt profile --source).
SOURCE_SECTION = "SourceCounters"
SOURCE_FILE = "source_sass.csv"
#: With SOURCE_SECTION: sample each warp once every 2^(5+0) = 32 cycles, ncu's finest. Its `auto` chose 2048 cycles
#: for a 5.6 µs decode kernel on an H100 (2026-12-08): 18 samples in all, too few to rank instructions by.
SAMPLING_INTERVAL = 0
#: Warp stall reasons, as ncu names them in smsp__average_warp_latency_issue_stalled_<r>.ratio (the
#: family knowledge/profiling/diagnosis_checklist.md verified on an H200 with ncu 2025.3.1). The
#: WarpStateStats section's per-issue family (ALTERNATES) is read when the first is absent; only
#: shares within one family are compared.
STALL_REASONS = ("long_scoreboard", "short_scoreboard", "barrier", "membar", "mio_throttle", "lg_throttle",
                 "math_pipe_throttle", "tex_throttle", "wait", "not_selected", "no_instruction", "dispatch_stall",
                 "drain", "branch_resolving", "imc_miss", "sleeping", "misc")

#: kopt short name -> ncu metric name.
METRICS: dict[str, str] = {
    "duration_ns": "gpu__time_duration.sum",
    "dram_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_bytes": "dram__bytes.sum",
    "dram_read_bytes": "dram__bytes_read.sum",
    "dram_write_bytes": "dram__bytes_write.sum",
    "achieved_occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "theoretical_occupancy_pct": "sm__maximum_warps_per_active_cycle_pct",
    "waves_per_sm": "launch__waves_per_multiprocessor",
    "grid_size": "launch__grid_size",
    "block_size": "launch__block_size",
    "registers_per_thread": "launch__registers_per_thread",
    "smem_static_bytes": "launch__shared_mem_per_block_static",
    "smem_dynamic_bytes": "launch__shared_mem_per_block_dynamic",
    "sm_count": "device__attribute_multiprocessor_count",
    "limit_blocks": "launch__occupancy_limit_blocks",
    "limit_registers": "launch__occupancy_limit_registers",
    "limit_shared_mem": "launch__occupancy_limit_shared_mem",
    "limit_warps": "launch__occupancy_limit_warps",
    "tensor_pct": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "tensor_inst": "sm__inst_executed_pipe_tensor.sum",
    "inst_executed": "sm__inst_executed.sum",
    "lsu_inst": "sm__inst_executed_pipe_lsu.sum",
    "local_load_bytes": "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum",
    "l2_hit_pct": "lts__t_sector_hit_rate.pct",
    "sm_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "mem_pct": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "sm_active_pct": "sm__cycles_active.avg.pct_of_peak_sustained_elapsed",
    "issue_active_pct": "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "warp_cycles_per_issue": "smsp__average_warp_latency_per_inst_issued.ratio",
    **{f"stall_{r}": f"smsp__average_warp_latency_issue_stalled_{r}.ratio" for r in STALL_REASONS},
}
#: Other names of a short metric, read from the CSV when the primary is absent (not requested).
ALTERNATES: dict[str, str] = {
    "launch__sm_count": "sm_count",
    **{f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio": f"stall_{r}" for r in STALL_REASONS}}
_TIME = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9, "s": 1e9}
_BYTES = {"byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12, "kibyte": 1024, "mibyte": 1 << 20,
          "gibyte": 1 << 30}


def find_ncu() -> Optional[str]:
    """Path of the ncu executable, or None."""
    return shutil.which("ncu")


def profile_command(ncu: str, out_base: Path, target_argv: list[str], metrics: Optional[list[str]] = None,
                    sections=SECTIONS, launch_count: int = 64) -> list[str]:
    """The collection command line (see the module docstring); with SOURCE_SECTION, the finest warp sampling."""
    cmd = [ncu, "--nvtx", "--nvtx-include", NVTX_INCLUDE, "--clock-control", "none", "--target-processes", "all",
           "--launch-count", str(launch_count)]
    if SOURCE_SECTION in sections:
        cmd += ["--warp-sampling-interval", str(SAMPLING_INTERVAL)]
    for s in sections:
        cmd += ["--section", s]
    names = list(METRICS.values()) if metrics is None else metrics
    if names:
        cmd += ["--metrics", ",".join(names)]
    return cmd + ["--export", str(out_base), "--force-overwrite", *target_argv]


def import_command(ncu: str, report: Path, page: str = "raw", as_csv: bool = True) -> list[str]:
    """Export a saved report: `--page raw --csv` for parsing, `--page details` for people, `--page source` (SASS,
    with the SourceCounters section's per-instruction stall samples) for reading by hand."""
    cmd = [ncu, "--import", str(report), "--page", page]
    if page == "source":
        return cmd + ["--csv", "--print-source", "sass"]
    return cmd + (["--csv", "--print-units", "base"] if as_csv else [])


def normalize(value: Optional[float], unit: str) -> Optional[float]:
    """A value in kopt's units: times in ns, sizes in bytes, everything else as printed."""
    if value is None:
        return None
    u = (unit or "").strip().lower()
    if u in _TIME:
        return value * _TIME[u]
    if u in _BYTES:
        return value * _BYTES[u]
    return value


def _csv_rows(text: str) -> list[list[str]]:
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if '"Kernel Name"' in ln or ln.startswith('"ID"')), None)
    if start is None:
        raise ProfileError("ncu CSV has no header row with \"Kernel Name\" (not an ncu --csv export?)")
    return [r for r in csv.reader(io.StringIO("\n".join(lines[start:]))) if r]


def parse_csv(text: str) -> list[KernelMetrics]:
    """Parse `ncu --csv` output of `--page raw` (wide) or `--page details` (long) into per-launch metrics."""
    rows = _csv_rows(text)
    head = rows[0]
    if "Metric Name" in head:
        return _parse_long(head, rows[1:])
    has_units = len(rows) > 1 and number(rows[1][0]) is None   # the units row has an empty ID
    units = rows[1] if has_units else [""] * len(head)
    data = rows[2:] if has_units else rows[1:]
    out = []
    for r in data:
        rec = dict(zip(head, r))
        k = KernelMetrics(name=rec.get("Kernel Name", "?"), launch_id=_int(rec.get("ID")))
        for col, unit, val in zip(head, units, r):
            if "__" in col:
                _put(k, col, val, unit)
        _finish(k, rec)
        out.append(k)
    return out


_BY_NAME = {v: k for k, v in METRICS.items()}


def _put(k: KernelMetrics, name: str, val: str, unit: str) -> None:
    """Keep curated metrics (value in kopt units, text as printed); the full set stays in the CSV."""
    if name in _BY_NAME:
        k.raw[name] = f"{val} {unit}".strip()
        k.metrics[_BY_NAME[name]] = normalize(number(val), unit)
    elif name in ALTERNATES:
        k.raw[name] = f"{val} {unit}".strip()
        k.metrics["alt:" + ALTERNATES[name]] = normalize(number(val), unit)


def _finish(k: KernelMetrics, rec: dict) -> None:
    """Use the alternate stall family only when the primary one is entirely absent; geometry fallback."""
    alt = {n[4:]: v for n, v in k.metrics.items() if n.startswith("alt:")}
    k.metrics = {n: v for n, v in k.metrics.items() if not n.startswith("alt:")}
    stalls = {n: v for n, v in alt.items() if n.startswith("stall_")}
    if stalls and not any(v is not None for n, v in k.metrics.items() if n.startswith("stall_")):
        k.metrics.update(stalls)             # one family or the other, never a mix
        k.raw["kopt:stall_family"] = "per_issue_active (WarpStateStats)"
    for n, v in alt.items():
        if not n.startswith("stall_") and k.metrics.get(n) is None:
            k.metrics[n] = v
    _geometry_fallback(k, rec)


def _parse_long(head: list[str], rows: list[list[str]]) -> list[KernelMetrics]:
    launches: dict[tuple, tuple[KernelMetrics, dict]] = {}
    for r in rows:
        rec = dict(zip(head, r))
        key = (rec.get("ID"), rec.get("Kernel Name"))
        k, _ = launches.setdefault(key, (KernelMetrics(name=rec.get("Kernel Name", "?"),
                                                       launch_id=_int(rec.get("ID"))), rec))
        name = rec.get("Metric Name", "")
        if "__" in name:
            _put(k, name, rec.get("Metric Value", ""), rec.get("Metric Unit", ""))
    for k, rec in launches.values():
        _finish(k, rec)
    return [k for k, _ in launches.values()]


def _geometry_fallback(k: KernelMetrics, rec: dict) -> None:
    """Grid/block totals from the `Grid Size` / `Block Size` columns when the launch__ metrics are absent."""
    from kopt.profile.geometry import prod

    for key, col in (("grid_size", "Grid Size"), ("block_size", "Block Size")):
        if k.metrics.get(key) is None and rec.get(col):
            v = prod(rec[col])
            if v:
                k.metrics[key] = float(v)


def _int(text: Optional[str]) -> Optional[int]:
    v = number(text or "")
    return int(v) if v is not None else None


def mark_missing(kernels: list[KernelMetrics], dropped: dict[str, str]) -> None:
    """Record, per kernel, why each curated metric is NA."""
    for k in kernels:
        for short, name in METRICS.items():
            if k.metrics.get(short) is None:
                k.metrics.pop(short, None)
                k.missing[short] = dropped.get(name) or ("not in the ncu output (not collected for this "
                                                         "architecture, or n/a for this kernel)")


@dataclass
class NcuRun:
    """What a guarded ncu run produced."""

    kernels: list[KernelMetrics]
    files: list[str]
    commands: list[list[str]]
    output: str
    notes: list[str] = field(default_factory=list)
    hot: list[HotInstruction] = field(default_factory=list)


def _unknown_metrics(output: str, names: list[str]) -> list[str]:
    bad = [ln for ln in output.splitlines() if "==ERROR==" in ln]
    return [n for n in names if any(n in ln or f"{n.split('.')[0]}." in ln or ln.rstrip().endswith(n.split(".")[0])
                                    for ln in bad)]


def run(ncu: str, out_dir: Path, target_argv: list[str], timeout_s: float = 600.0, retries: int = 2,
        source: bool = False) -> NcuRun:
    """Collect, import and parse; retries without metrics this ncu rejects; ProfileError with a reason on failure.
    ``source``: also collect SourceCounters and export the SASS source page (SOURCE_FILE); an export that fails is
    a note, not an error (the counters stand)."""
    log, base = out_dir / "ncu.log", out_dir / "report"
    names, dropped, commands = list(METRICS.values()), {}, []
    sections = SECTIONS + ((SOURCE_SECTION,) if source else ())
    for attempt in range(retries + 1):
        cmd = profile_command(ncu, base, target_argv, names, sections)
        commands.append(cmd)
        p = run_logged(cmd, log, timeout_s)
        if p.timed_out:
            raise ProfileError(f"ncu timed out after {timeout_s:.0f} s (raise --timeout); log: {log.name}")
        if "ERR_NVGPUCTRPERM" in p.output:
            raise ProfileError("ncu may not read GPU performance counters (ERR_NVGPUCTRPERM): run as root or allow "
                               "non-admin profiling (NVreg_RestrictProfilingToAdminUsers=0)")
        err = target_error(p.output)
        if err:
            raise ProfileError(f"the profiled target failed: {err}")
        bad = _unknown_metrics(p.output, names) if p.rc != 0 else []
        if bad and attempt < retries:
            for n in bad:
                dropped[n] = "rejected by this ncu version (dropped and re-run)"
            names = [n for n in names if n not in bad]
            continue
        if p.rc != 0:
            raise ProfileError(f"ncu exited with status {p.rc}: {tail_lines(p.output)} (log: {log.name})")
        break
    rep = base.with_suffix(".ncu-rep")
    if not rep.is_file():
        raise ProfileError(f"ncu wrote no report: no kernel ran inside NVTX range {NVTX_INCLUDE!r} "
                           f"({tail_lines(p.output, 2)}; log: {log.name})")
    files = [rep.name, log.name]
    cmd = import_command(ncu, rep)
    commands.append(cmd)
    imp = run_logged(cmd, out_dir / "ncu_import.log", timeout_s)
    if imp.rc != 0:
        raise ProfileError(f"ncu --import failed ({tail_lines(imp.output)}); the report is kept: {rep.name}")
    (out_dir / "report_raw.csv").write_text(imp.output)
    files.append("report_raw.csv")
    kernels = parse_csv(imp.output)
    if not kernels:
        raise ProfileError(f"ncu report {rep.name} holds no kernel launches")
    mark_missing(kernels, dropped)
    det = run_logged(import_command(ncu, rep, "details", as_csv=False), out_dir / "ncu_import.log", timeout_s)
    if det.rc == 0:
        (out_dir / "report_details.txt").write_text(det.output)
        files.append("report_details.txt")
    notes = [f"ncu dropped {len(dropped)} metric(s) it does not know: {', '.join(sorted(dropped))}"] if dropped else []
    hot = []
    if source:
        cmd = import_command(ncu, rep, "source")
        commands.append(cmd)
        src = run_logged(cmd, out_dir / "ncu_import.log", timeout_s)
        if src.rc == 0 and src.output.strip():
            (out_dir / SOURCE_FILE).write_text(src.output)
            files.append(SOURCE_FILE)
            hot, why = _hot(src.output)
            notes += why + dropped_samples_note(imp.output)
        else:
            why = tail_lines(src.output) or "no output"
            notes.append(f"{SOURCE_FILE}: NA, ncu's source page export failed ({why})")
    return NcuRun(kernels, files, commands, p.output, notes, hot)


#: Fewer samples in a kernel than this and its shares are called coarse in the notes.
FEW_SAMPLES = 200


def dropped_samples_note(raw: str) -> list[str]:
    """A note when ncu's sample buffer overflowed (smsp__pcsamp_dropped_bytes in the raw page, read if there)."""
    rows = _csv_rows(raw)
    col = "smsp__pcsamp_dropped_bytes"
    if col not in rows[0]:
        return []
    i = rows[0].index(col)
    dropped = sum(number(r[i]) or 0 for r in rows[1:] if len(r) > i)
    return [f"ncu dropped {dropped:,.0f} bytes of warp samples (its buffer was full): the hot-instruction shares "
            "undercount"] if dropped else []


def _hot(text: str) -> tuple[list[HotInstruction], list[str]]:
    """parse_source with its caveats as notes: a page it cannot read is NA, a kernel with few samples is coarse."""
    try:
        hot, totals = parse_source(text)
    except ProfileError as e:
        return [], [f"hot instructions: NA, {e}"]
    notes = [f"warp samples per kernel (one every {2 ** (5 + SAMPLING_INTERVAL)} cycles): "
             + ", ".join(f"{k} {n}" for k, n in totals.items())]
    few = [k for k, n in totals.items() if n < FEW_SAMPLES]
    if few:
        notes.append(f"fewer than {FEW_SAMPLES} warp samples in {', '.join(few)}: its hot-instruction shares are "
                     "coarse")
    return hot, notes
