"""`kopt profile`: choose a profiler, run the target under it, diagnose, write summary.md/.json.

Output: results/<backend>/profiling/case<N>/<YYYYmmddTHHMMSS>/ in the workspace, holding the
raw files of the tool (report.ncu-rep + report_raw.csv, trace.json, mcProfiler/mcTracer output),
summary.json (kopt.profile.models.ProfileSummary) and summary.md.

Tool choice (`auto`): CPU -> torch; a MetaX device -> mcProfiler (+ mcTracer) when installed;
otherwise ncu when installed; else the torch timeline, with the reason in the notes.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from kopt.errors import UsageError
from kopt.profile import metax, ncu, torchprof
from kopt.profile.common import ProfileError, TargetSpec
from kopt.profile.models import KernelMetrics, ProfileSummary, Tool, config_text

TOOLS = ("auto", "ncu", "torch", "mcprofiler", "mctracer")


@dataclass
class ProfileOptions:
    """What `kopt profile` was asked to do."""

    case: int
    tool: str = "auto"
    candidate: Optional[Path] = None
    device: str = "auto"
    dtype: Optional[str] = None
    head_dim: Optional[int] = None
    page_size: Optional[int] = None
    seqlens: Optional[str] = None
    seed: int = 0
    heldout: int = 0
    """The held-out draw's size (`kopt verify --heldout`) when ``case`` is one of its ids."""
    heldout_seed: Optional[int] = None
    """The held-out draw's seed (`kopt verify --heldout-seed`); None: the case is a named one."""
    warmup: int = 5
    calls: int = 3
    timeout_s: float = 600.0
    timeline: bool = True
    """Also take a kineto/mcTracer timeline next to the counters (SM-timeline dimension)."""
    kernel_name: Optional[str] = None
    source: bool = False
    """ncu only: also sample warp stalls per SASS instruction (SourceCounters) and export them (source_sass.csv)."""
    out_dir: Optional[Path] = None
    config: Optional[dict] = None
    """Passed as run(config=...) (a kernel variant to profile beside the default plan); None: the candidate's own."""


def declared_backend(path: Path) -> str:
    """The candidate's module-level `BACKEND = "..."`, read without importing it ("NA" when absent)."""
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, ValueError):
        return "NA"
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "BACKEND" for t in node.targets):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                return node.value.value
    return "NA"


def output_dir(ws: Path, backend: str, case: int, now: Optional[datetime] = None) -> Path:
    """results/<backend>/profiling/case<N>/<stamp>/, made unique with a suffix when it exists."""
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in backend) or "NA"
    base = ws / "results" / safe / "profiling" / f"case{case}" / stamp
    d, i = base, 1
    while d.exists():
        d, i = base.with_name(f"{stamp}-{i}"), i + 1
    d.mkdir(parents=True)
    return d


def choose_tool(tool: str, device: str, vendor: str) -> tuple[Tool, list[str]]:
    """The tool to run and the notes explaining any fallback. An explicit tool that cannot run here (no CUDA
    device for ncu, the profiler not on PATH) is a usage error, exit 2, as --device cuda is without a GPU:
    nothing ran; ProfileError (exit 1) is for a profiler that ran and failed."""
    if tool not in TOOLS:
        raise UsageError(f"--tool must be one of {', '.join(TOOLS)} (got {tool!r})")
    gpu = device.startswith("cuda")
    if tool == "ncu":
        if not gpu:
            raise UsageError("ncu needs a CUDA device (none visible, or --device cpu); use --tool torch")
        if not ncu.find_ncu():
            raise UsageError("ncu (Nsight Compute CLI) is not on PATH; install it or use --tool torch")
        return Tool.ncu, []
    if tool in ("mcprofiler", "mctracer"):
        find = metax.find_mcprofiler if tool == "mcprofiler" else metax.find_mctracer
        if not find():
            raise UsageError(f"{'mcProfiler' if tool == 'mcprofiler' else 'mcTracer'} is not on PATH "
                             "(MetaX MACA SDK); use --tool torch")
        return Tool(tool), []
    if tool == "torch" or not gpu:
        return Tool.torch, [] if tool == "torch" else ["CPU run: torch.profiler timeline only"]
    if vendor == "metax":
        if metax.find_mcprofiler():
            return Tool.mcprofiler, []
        if metax.find_mctracer():
            return Tool.mctracer, ["mcProfiler not on PATH: mcTracer timeline only"]
        return Tool.torch, ["MetaX device but neither mcProfiler nor mcTracer on PATH: torch.profiler fallback"]
    if ncu.find_ncu():
        return Tool.ncu, []
    return Tool.torch, ["ncu not on PATH: torch.profiler timeline fallback (no hardware counters)"]


def _merge_metax(counters: list[KernelMetrics], launches: list[KernelMetrics]) -> list[KernelMetrics]:
    """Counters from mcProfiler reports merged into mcTracer launches of the same kernel name."""
    out = [KernelMetrics(**k.model_dump()) for k in launches]
    for c in counters:
        match = next((k for k in out if k.name in c.name or c.name in k.name), out[0] if len(out) == 1 else None)
        if match is None:
            out.append(c)
            continue
        match.metrics.update(c.metrics)
        match.raw.update({f"mcProfiler:{n}": v for n, v in c.raw.items()})
    return out or counters


def profile(opts: ProfileOptions, progress: Optional[Callable[[str], None]] = None) -> ProfileSummary:
    """Run one profile end to end; returns the summary it also wrote to disk."""
    from kopt import hardware, workloads
    from kopt.candidate import candidate_id, resolve
    from kopt.cases import load_cases
    from kopt.hardware import resolve_device
    from kopt.paths import default_candidate, recorded, relative, workspace
    from kopt.profile import diagnosis
    from kopt.profile.render import write_summary

    say = progress or (lambda _msg: None)
    ws = workspace()
    device = resolve_device(opts.device)
    case = workloads.one_case(load_cases(), opts.case, opts.heldout, opts.heldout_seed, cpu=device == "cpu")
    case = case.with_variant(dtype=opts.dtype, head_dim=opts.head_dim, page_size=opts.page_size, seqlens=opts.seqlens)
    path = resolve(opts.candidate or default_candidate(ws))
    info = hardware.detect(device)
    vendor = info.profile.vendor if info.profile else ("cpu" if device == "cpu" else "nvidia")
    tool, notes = choose_tool(opts.tool, device, vendor)
    if opts.source and tool != Tool.ncu:
        raise UsageError(f"--source samples warp stalls per SASS instruction with ncu; this run would use {tool.value} "
                         "(give --tool ncu on a CUDA device)")
    backend = declared_backend(path)
    out = opts.out_dir or output_dir(ws, backend, case.id)
    out.mkdir(parents=True, exist_ok=True)
    spec = TargetSpec(candidate=path, case=case.id, device=device, dtype=case.variant.dtype.value,
                      head_dim=case.variant.head_dim, page_size=case.variant.page_size or 0,
                      seqlens=case.variant.seqlens.value, seed=opts.seed, warmup=opts.warmup,
                      heldout=opts.heldout, heldout_seed=opts.heldout_seed,
                      config=config_text(opts.config))
    s = ProfileSummary(case=case.id, variant=case.variant.label(), shape=case.shape_dict(),
                       candidate_path=recorded(path, ws), candidate_id=candidate_id(path), backend=backend, tool=tool,
                       requested_tool=opts.tool, device=device, device_name=info.name, out_dir=relative(out, ws),
                       notes=notes, config=opts.config)
    kernels, timeline = _collect(tool, spec, out, opts, info.units, s, say)
    kv, outb, ideal = _bytes(case, opts.seed)
    s.ideal_bytes = ideal
    s.copy_ceiling_gbps = _ceiling(info.name, device)
    if device.startswith("cuda") and s.copy_ceiling_gbps is None:
        s.notes.append(f"no measured copy ceiling for {info.name} yet (run `kopt bench` once): % of ceiling is NA")
    if tool == Tool.ncu:
        s.notes.append("ncu replays the kernel with caches flushed and clocks as set: use its ratios, not its "
                       "durations, against kopt bench RUNTIME (pattern M)")
    s.kernels, s.timeline = kernels, timeline.to_dict(top=20) if timeline is not None else None
    units = next((int(k.metrics["sm_count"]) for k in kernels if k.metrics.get("sm_count")), None) or info.units
    ev = diagnosis.Evidence(kernels=kernels, timeline=timeline, units=units if device != "cpu" else None,
                            unit_name=info.unit_name, vendor=vendor, source=_source(tool, timeline), kv_bytes=kv,
                            out_bytes=outb, ideal_bytes=ideal, copy_ceiling_gbps=s.copy_ceiling_gbps,
                            paged=bool(case.variant.page_size), native_cpu=device == "cpu" and backend != "torch")
    if device != "cpu":  # a CPU run has no grid to balance
        ev.balance, ev.balance_na = _balance(ws, s.candidate_id, case, opts.seed, units, info.name, opts.config,
                                             opts.heldout_seed, opts.heldout)
    s.diagnosis = diagnosis.diagnose(ev)
    # command lines as run from the workspace: its own paths relative, so a summary names no host path
    s.commands = [_rel_cmd(cmd, ws) for cmd in s.commands]
    say("writing summary")
    write_summary(s, out)
    return s


def _collect(tool: Tool, spec: TargetSpec, out: Path, opts: ProfileOptions, units, s: ProfileSummary, say):
    """Run the chosen tool (and a timeline beside counters); returns (kernels, timeline summary)."""
    from kopt.profile.trace import load_trace, summarize

    kernels, timeline = [], None
    if tool == Tool.ncu:
        say("ncu: profiling one call (kernel replay takes a while)")
        r = ncu.run(ncu.find_ncu(), out, spec.argv(), timeout_s=opts.timeout_s, source=opts.source)
        kernels, s.files, s.commands, s.notes = r.kernels, s.files + r.files, s.commands + r.commands, s.notes + r.notes
        s.hot = r.hot
    elif tool == Tool.mcprofiler:
        say("mcProfiler: collecting counters")
        kernels, files, cmds = metax.run_mcprofiler(metax.find_mcprofiler(), out, spec.argv(),
                                                     f"kopt_case{spec.case}", opts.timeout_s, opts.kernel_name)
        s.files, s.commands = s.files + files, s.commands + cmds
        s.notes.append("MetaX command lines and report formats are UNVERIFIED (public usage, not MetaX docs)")
    if tool in (Tool.mctracer, Tool.mcprofiler) and (opts.timeline or tool == Tool.mctracer):
        if metax.find_mctracer() is None:
            s.notes.append("mcTracer not on PATH: no timeline (SM-timeline dimension from counters only)")
        else:
            say("mcTracer: recording the timeline")
            try:
                trace, cmds = metax.run_mctracer(metax.find_mctracer(), out, spec.argv(), opts.timeout_s)
                data = load_trace(trace)
                timeline = summarize(data, units=units)
                kernels = _merge_metax(kernels, metax.tracer_kernels(data))
                s.files.append(str(trace.relative_to(out)))
                s.commands += cmds
            except ProfileError as e:
                if tool == Tool.mctracer:
                    raise
                s.notes.append(f"timeline skipped: {e}")
    if tool == Tool.torch or (tool == Tool.ncu and opts.timeline):
        say("torch.profiler: recording a timeline of a few calls")
        try:
            r = torchprof.run(spec, out, calls=opts.calls, timeout_s=opts.timeout_s, units=units)
            timeline = r.summary
            s.files += [torchprof.TRACE_NAME, "target.log"]
            s.commands.append(r.command)
            if tool == Tool.torch:
                kernels = torchprof.kernels_from_timeline(timeline)
        except ProfileError as e:
            if tool == Tool.torch:
                raise
            s.notes.append(f"timeline skipped: {e}")
    return kernels, timeline


def _source(tool: Tool, timeline) -> str:
    base = {Tool.ncu: "ncu hardware counters", Tool.mcprofiler: "mcProfiler counters (approximate mapping)",
            Tool.mctracer: "mcTracer timeline", Tool.torch: "torch.profiler timeline"}[tool]
    return base + (" + timeline" if timeline is not None and tool in (Tool.ncu, Tool.mcprofiler) else "")


def _bytes(case, seed: int) -> tuple[int, int, int]:
    """(K/V bytes of the valid keys, output bytes, all bytes a call must move)."""
    from kopt.workload import bytes_moved, seqlens_for

    keys = int(seqlens_for(case, seed).sum())
    v = case.variant
    return 2 * keys * case.kv_heads * v.head_dim * 2, case.batch * case.q_heads * v.head_dim * 2, bytes_moved(case,
                                                                                                              keys)


def _balance(ws: Path, cid: str, case, seed: int, units: Optional[int], device_name: str,
             config: Optional[dict] = None, heldout_seed: Optional[int] = None, heldout: int = 0):
    """(geometry.Balance of the candidate's plan on the profiled lengths, why None). The plan is the one the
    candidate reported (its plan_info hook) in its latest ledger row of this case, variant and config (None:
    its own plan) on this device (a held-out case: of a verdict of its draw's seed); the profiled process is not
    asked, so a case never benched there has none."""
    from kopt.paths import ledger_file
    from kopt.profile.geometry import plan_balance
    from kopt.store import load_dicts
    from kopt.workload import seqlens_for

    label, held = case.variant.label(), case.kind == "heldout"
    plan = next((r["plan"] for r in reversed(load_dicts(ledger_file(ws)).rows)
                 if r.get("candidate_id") == cid and r.get("case") == case.id and r.get("variant") == label
                 and r.get("device") == device_name and r.get("config") == config
                 and (not held or r.get("heldout_seed") == heldout_seed)
                 and isinstance(r.get("plan"), dict)), None)
    if plan is None:
        with_cfg = f" --config '{config_text(config)}'" if config is not None else ""
        run = f"kopt bench --case {case.id}{with_cfg}" + (f" --heldout {heldout} --heldout-seed {heldout_seed}"
                                                         if held else "")
        return None, (f"no plan recorded for candidate {cid} on case {case.id} ({label})"
                      f"{' with that config' if with_cfg else ''} on {device_name}: run `{run}` first")
    return plan_balance(plan, seqlens_for(case, seed).tolist(), case.kv_heads, case.capacity, units)


def _ceiling(name: str, device: str) -> Optional[float]:
    """The cached measured copy ceiling (profiling never spends time measuring one)."""
    if not device.startswith("cuda"):
        return None
    from kopt.hardware import read_cached

    hit = read_cached(name)
    return hit.copy_gbps if hit else None


def _rel_arg(arg: str, ws: Path) -> str:
    """A command-line argument with the workspace prefix removed from any path inside it."""
    root = str(ws.resolve()).rstrip("/") + "/"
    return str(arg).replace(root, "")


def _rel_cmd(cmd: list[str], ws: Path) -> list[str]:
    """A recorded command line that names no host path: the tool it runs (an absolute first word) and this
    interpreter by their names, workspace paths relative (_rel_arg)."""
    import sys

    return [Path(a).name if a == sys.executable or (i == 0 and Path(str(a)).is_absolute()) else _rel_arg(a, ws)
            for i, a in enumerate(cmd)]


