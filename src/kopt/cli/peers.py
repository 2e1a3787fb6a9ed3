"""`kopt peers`: the candidate against every decode kernel a user would pick, side by side in one run."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer

from kopt.cli import options
from kopt.cli.options import CaseSelection, VariantOpts, resolve_cases


def command(
    case: options.Case = None,
    all_: options.AllCases = False,
    candidate: options.Candidate = None,
    peers: Optional[str] = typer.Option(None, "--peers", help="Comma-separated subset of "
                                                              "fa2,fa2-paged,fa3,flashinfer,torch (default: all), "
                                                              "and candidate files (a .py path, REV:PATH.py "
                                                              "as a commit or branch holds it, or a .patch over "
                                                              "the shipped candidate: its own plan, timed as a "
                                                              "peer)."),
    device: options.Device = "auto",
    dtype: Optional[str] = VariantOpts.dtype,
    head_dim: Optional[int] = VariantOpts.head_dim,
    page_size: Optional[int] = VariantOpts.page_size,
    seqlens: Optional[str] = VariantOpts.seqlens,
    as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout (the panel's rows and notes)."),
    machine: options.Machine = False,
    no_record: bool = typer.Option(False, "--no-record", help="No ledger rows, no files under results/."),
    out: Optional[Path] = typer.Option(None, "--out", help="CSV file (default "
                                                           "results/<backend>/peers-<device>-<date>.csv)."),
    timeout: float = typer.Option(600.0, "--timeout", min=1.0, help="Wall-clock limit per case, seconds."),
    quick: bool = typer.Option(False, "--quick", help="Fewer timing samples (smoke runs; not for results)."),
    heldout: int = typer.Option(0, "--heldout", min=0, max=256, help="Also N held-out draws from "
                                                                     "bench/workloads.yaml (kopt workloads)."),
    heldout_seed: Optional[int] = typer.Option(None, "--heldout-seed", min=0, help="Seed of the held-out draw "
                                                                                   "(a verdict's HELDOUT_SEED draws "
                                                                                   "its shapes); with it --case "
                                                                                   "1003 is that draw's third "
                                                                                   "shape."),
) -> None:
    """Time the candidate against every available peer (FA2, FA2 paged-256, FA3, FlashInfer, torch SDPA), per case."""
    from kopt.cli.common import err_console
    from kopt.eval import bench
    from kopt.eval.peers import check_names
    from kopt.paths import default_candidate, workspace
    from kopt.records import machine_line
    from kopt.report import panel
    from kopt.store import resolve_candidate as resolve

    t0 = time.perf_counter()
    cases = [] if heldout and not (case or all_) else \
        resolve_cases(CaseSelection(case, all_), dtype, head_dim, page_size, seqlens, None, heldout_seed, device)
    if heldout:
        from kopt.eval.jobs import fresh_seed
        from kopt.eval.verdict import heldout_draw
        from kopt.hardware import resolve_device

        seed = fresh_seed() if heldout_seed is None else heldout_seed
        cases += [c.with_variant(dtype=dtype) for c in heldout_draw(heldout, seed, resolve_device(device))]
    names = check_names([p.strip() for p in peers.split(",")]) if peers is not None else None
    path = resolve(candidate or default_candidate())
    err = err_console()
    opts = bench.BenchOptions(device=device, timeout_s=timeout, record=not no_record, quick=quick,
                              heldout_seed=seed if heldout else heldout_seed)

    def on_result(r):
        if machine:  # the row's line: REF and SPEEDUP are the best peer's
            print(machine_line(r), flush=True)
        elif not as_json:
            err.print(f"[dim]case {r.case}: "
                      f"{r.status.value}[/dim]" + (f" [yellow]{r.message}[/yellow]" if r.message else ""),
                      highlight=False, soft_wrap=True)

    rows = bench.evaluate_peers(path, cases, opts, names, on_result)
    files = [] if no_record else panel.write_results(rows, cases, workspace(), out)
    p = panel.build([r.model_dump(mode="json") for r in rows], {c.id: c.kind for c in cases})
    if as_json:
        print(json.dumps({"notes": panel.notes(p), "files": [str(f) for f in files],
                          "rows": [r.model_dump(mode="json") for r in rows],
                          "wall_s": round(time.perf_counter() - t0, 2)}))
    elif not machine:  # markdown: readable in a terminal, and the table results/ keeps
        print(panel.markdown(p), end="", flush=True)
        for f in files:
            err.print(f"[dim]wrote {f}[/dim]", highlight=False)
    if not all(r.compiled and r.correct for r in rows):
        raise typer.Exit(1)
