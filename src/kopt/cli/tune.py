"""`kopt tune`: screen the candidate's configs per case, pair the fastest with the default, keep a proven winner."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from kopt.cli import options
from kopt.cli.options import CaseSelection, ExecutorOpts, VariantOpts, resolve_cases


def command(
    case: options.Case = None,
    all_: options.AllCases = False,
    candidate: options.Candidate = None,
    device: options.Device = "auto",
    gpus: Optional[str] = typer.Option(None, "--gpus", help="Spread the work over N GPUs of this host (or 'all')."),
    executor: str = ExecutorOpts.executor,
    ray_address: Optional[str] = ExecutorOpts.ray_address,
    ray_shared: bool = ExecutorOpts.ray_shared,
    max_configs: Optional[int] = typer.Option(None, "--max-configs", min=1,
                                              help="Try at most K configs per case: the default + K-1 spread evenly."),
    quick: bool = typer.Option(False, "--quick", help="Quick timing for the finalist pairs too (the screen is "
                               "always quick): smoke runs, the budget choice."),
    finalists: int = typer.Option(3, "--finalists", min=0,
                                  help="After the quick screen, time the N fastest configs against the default "
                                       "(ABBA rounds); one replaces the default only when its paired speedup passes "
                                       "the improvement rule. 0: pick by screened medians."),
    hot: bool = typer.Option(True, "--hot/--no-hot", help="Also time hot (CUDA-graph replay); cold always decides."),
    compile_jobs: Optional[int] = typer.Option(None, "--compile-jobs", min=0,
                                               help="Parallel compile children per case (default: auto on CUDA, 0 on "
                                                    "CPU)."),
    dtype: Optional[str] = VariantOpts.dtype,
    head_dim: Optional[int] = VariantOpts.head_dim,
    page_size: Optional[int] = VariantOpts.page_size,
    config: Optional[list[str]] = typer.Option(None, "--config", help="A JSON config to search beside the "
                                               "candidate's default, instead of its configs(case); repeat it for "
                                               "more. Keys are checked as `kopt bench --config` checks them."),
    heldout_seed: options.HeldoutSeed = None,
    heldout: options.HeldoutSize = None,
    csv: Optional[Path] = typer.Option(None, "--csv", help="Tuning table (default results/<backend>/tuning.csv)."),
    no_write: bool = typer.Option(False, "--no-write", help="Do not update the tuning table."),
    no_record: bool = typer.Option(False, "--no-record", help="Do not append mode=tune rows to candidates.jsonl."),
    timeout: float = typer.Option(600.0, "--timeout", min=1.0, help="Wall-clock limit per tuning child, seconds."),
    budget: Optional[float] = typer.Option(None, "--budget", min=1.0,
                                           help="Stop after SECONDS: no case starts after it; TUNE_SUMMARY's NOT_RUN "
                                                "names the cases not tuned."),
    as_json: options.Json = False,
) -> None:
    """Per case: compile, check and quick-time every config of configs(case), pair the fastest against the
    default; upsert the winner (a paired improvement over the default, else the default)."""
    from kopt import tune
    from kopt.errors import UsageError
    from kopt.executor import pool
    from kopt.paths import default_candidate
    from kopt.store import resolve_candidate as resolve
    from kopt.timing.stats import geomean

    t0 = time.perf_counter()
    pool.parse_spec(gpus)  # a bad --gpus is a usage error before any work
    cases = resolve_cases(CaseSelection(case, all_), dtype, head_dim, page_size, None, heldout, heldout_seed, device)
    held = [c.id for c in cases if c.kind == "heldout"]
    if held and not no_write:
        what = f"case {held[0]} is a held-out draw" if len(held) == 1 else \
            f"cases {','.join(map(str, held))} are held-out draws"
        raise UsageError(f"{what}: a tuned row would apply to the draw's shape bucket, and the held-out verdict would "
                         "then grade the table, not the plan rule. Add --no-write to search configs without writing "
                         "the table")
    path = resolve(candidate or default_candidate())
    given = [options.config_for(c, path) for c in config or []]
    opts = tune.TuneOptions(device=device, gpus=gpus, max_configs=max_configs, quick=quick, hot=hot,
                            timeout_s=timeout, csv=csv, write=not no_write, record=not no_record,
                            compile_jobs=compile_jobs, finalists=finalists, executor=executor,
                            ray_address=ray_address, ray_shared=ray_shared,
                            deadline=None if budget is None else time.time() + budget, heldout_seed=heldout_seed,
                            configs=given or None)
    results = tune.tune(path, cases, opts, on_case=None if as_json else lambda ct: print(ct.line(), flush=True))
    wall = time.perf_counter() - t0
    g = geomean([ct.gain for ct in results if ct.gain])
    failed = [ct for ct in results if ct.status == "failed"]
    tuned = {ct.case.id for ct in results}
    not_run = [c.id for c in cases if c.id not in tuned]
    state = "failed" if failed else "stopped" if not_run else "ok"
    summary = (f"TUNE_SUMMARY:{state} CASES:{len(results)} TUNED:{sum(ct.ok for ct in results)} "
               f"NOT_APPLICABLE:{sum(bool(ct.not_applicable) for ct in results)} "
               f"GEOMEAN_GAIN:{'NA' if g is None else f'{g:.4f}x'} WALL:{wall:.1f}s "
               f"NOT_RUN:{','.join(map(str, not_run)) or 'NA'}")
    if as_json:
        print(json.dumps({"summary": summary, "geomean_gain": g, "wall_s": round(wall, 2),
                          "cases": [_case_json(ct) for ct in results]}))
    else:
        print(summary, flush=True)
        csvs = sorted({str(ct.csv) for ct in results if ct.csv})
        if csvs:
            print(f"kopt tune: table {', '.join(csvs)}", file=sys.stderr)
    if not_run:
        print(f"kopt tune: the budget of {budget:g} s was spent; not run: case(s) {','.join(map(str, not_run))}",
              file=sys.stderr)
    if failed:
        raise typer.Exit(1)


def _case_json(ct) -> dict:
    """A JSON-able summary of one case's tuning."""
    default_ms, best_ms = ct.times_ms()
    return {"case": ct.case.id, "line": ct.line(), "ok": ct.ok, "status": ct.status,
            "not_applicable": ct.not_applicable or None, "gain": ct.gain,
            "gain_ci": list(ct.gain_ci) if ct.gain_ci else None, "note": ct.note,
            "finalists": [s.finalists for s in ct.shards], "default_ms": default_ms, "best_ms": best_ms,
            "config": ct.winner.config if ct.winner else None,
            "wall_s": round(ct.wall_s, 2), "csv": str(ct.csv) if ct.csv else None,
            "row": ct.row.model_dump() if ct.row else None,
            "configs": [c.model_dump(mode="json", exclude={"outputs", "dir"}) for c in ct.configs]}
