"""`kopt profile`: profile one case with ncu / mcProfiler / torch.profiler and print the six-dimension diagnosis."""

from __future__ import annotations

from typing import Optional

import typer

from kopt.cli import options
from kopt.cli.options import VariantOpts


def command(
    case: options.OneCase = None,
    tool: str = typer.Option("auto", "--tool", help="auto | ncu | torch | mcprofiler | mctracer."),
    candidate: options.Candidate = None,
    device: options.Device = "auto",
    dtype: Optional[str] = VariantOpts.dtype,
    head_dim: Optional[int] = VariantOpts.head_dim,
    page_size: Optional[int] = VariantOpts.page_size,
    seqlens: Optional[str] = VariantOpts.seqlens,
    seed: int = typer.Option(0, "--seed", help="Input seed."),
    heldout_seed: options.HeldoutSeed = None,
    heldout: options.HeldoutSize = None,
    config: options.Config = None,
    warmup: int = typer.Option(5, "--warmup", min=1, help="Calls before the profiled one (the first compiles)."),
    calls: int = typer.Option(3, "--calls", min=1, max=50, help="Calls recorded in the timeline."),
    timeline: bool = typer.Option(True, "--timeline/--no-timeline", help="Also record a timeline beside ncu/mcProfiler "
                                                                         "counters."),
    kernel_name: Optional[str] = typer.Option(None, "--kernel-name", help="mcProfiler kernel-name filter."),
    source: bool = typer.Option(False, "--source", help="ncu only: also sample warp stalls per SASS instruction "
                                                        "(SourceCounters, every 32 cycles), export them as "
                                                        "source_sass.csv and list the most sampled, each with what "
                                                        "it waits on."),
    timeout: float = typer.Option(600.0, "--timeout", min=1.0, help="Wall-clock limit per profiler run, seconds."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object (summary.json) on stdout."),
) -> None:
    """Profile one case of a candidate; raw reports, summary.md and summary.json go to results/<backend>/profiling/."""
    from kopt.cli.common import err_console, out_console
    from kopt.errors import UsageError
    from kopt.paths import default_candidate
    from kopt.profile.diagnosis import pattern_titles
    from kopt.profile.render import diagnosis_table, hot_table
    from kopt.profile.runner import ProfileOptions, profile
    from kopt.store import resolve_candidate as resolve

    if case is None:
        raise UsageError("choose the case to profile with --case N (e.g. --case 10)")
    heldout = options.heldout_size(heldout, heldout_seed)
    case = options.one_case(case, heldout=heldout, heldout_seed=heldout_seed)
    candidate = resolve(candidate or default_candidate())
    cfg = options.config_for(config, candidate)
    opts = ProfileOptions(case=case, tool=tool, candidate=candidate, device=device, dtype=dtype, head_dim=head_dim,
                          page_size=page_size, seqlens=seqlens, seed=seed, heldout=heldout,
                          heldout_seed=heldout_seed, warmup=warmup, calls=calls,
                          timeout_s=timeout, timeline=timeline, kernel_name=kernel_name, source=source,
                          config=cfg)
    err = err_console()
    with err.status(f"profiling case {case}...") as st:
        s = profile(opts, progress=lambda msg: st.update(f"case {case}: {msg}"))
    if as_json:
        print(s.model_dump_json())
        return
    out_console().print(diagnosis_table(s.diagnosis, pattern_titles(),
                                        title=f"case {case} ({s.variant}) - {s.diagnosis.source}"))
    if s.hot:
        out_console().print(hot_table(s.hot))
    for n in s.notes:
        err.print(f"[dim]note: {n}[/dim]", highlight=False)
    err.print(f"wrote {s.out_dir}/summary.md (kernel: {s.diagnosis.kernel or 'NA'})", highlight=False)
