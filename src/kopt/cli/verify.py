"""`kopt verify [PATH]`: the Verdict. A machine line per run and one aggregate VERDICT line."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer

from kopt.cli import options
from kopt.cli.options import ExecutorOpts


def command(
    path: Optional[Path] = typer.Argument(None, help="Candidate file (default solution/tilelang/run_kernel.py)."),
    case: Optional[str] = typer.Option(None, "--case", "-c", help="Perf cases to time (default: every perf and ragged "
                                                                  "case)."),
    device: options.Device = "auto",
    parent: Optional[str] = typer.Option(None, "--parent", help="Parent candidate id (default: the current best)."),
    technique: Optional[str] = typer.Option(None, "--technique", help="What this candidate tries (e.g. split-kv)."),
    hypothesis: Optional[str] = typer.Option(None, "--hypothesis", help="The prediction being tested."),
    config: options.Config = None,
    machine: bool = typer.Option(False, "--machine", help="Only machine lines on stdout."),
    as_json: options.Json = False,
    timeout: float = typer.Option(600.0, "--timeout", min=1.0, help="Wall-clock limit per run, seconds."),
    quick: bool = typer.Option(False, "--quick", help="Fewer timing samples (smoke runs only)."),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="Spread the runs over N GPUs of this host (or 'all')."),
    baseline: str = typer.Option("auto", "--baseline", help="auto | fa2 | fa2-paged | fa3 | flashinfer | torch (kopt "
                                                            "bench --baseline)."),
    executor: str = ExecutorOpts.executor,
    ray_address: Optional[str] = ExecutorOpts.ray_address,
    ray_shared: bool = ExecutorOpts.ray_shared,
) -> None:
    """Time every perf and ragged case cold, run the correctness matrix and hidden variants; record verdict rows."""
    from kopt import executor as executors
    from kopt.baselines import BASELINE_CHOICES
    from kopt.candidate import resolve
    from kopt.cases import load_file, select
    from kopt.cli.common import err_console, parse_ids
    from kopt.eval import verdict
    from kopt.eval.bench import BenchOptions
    from kopt.paths import default_candidate, ledger_file
    from kopt.records import machine_line

    t0 = time.perf_counter()
    cf = load_file()
    ids = parse_ids(case)
    if ids:
        select(cf.cases, ids)  # unknown ids -> usage error listing the valid ones
    p = resolve(path or default_candidate())
    opts = BenchOptions(device=device, cold=True, timeout_s=timeout, quick=quick, config=options.config_json(config),
                        baseline=options.choice(baseline, BASELINE_CHOICES, "--baseline"),
                        parent_id=parent or _current_best(ledger_file()), technique=technique, hypothesis=hypothesis)
    err = err_console()

    def on_result(r):
        if machine:
            print(machine_line(r), flush=True)
        elif not as_json:
            err.print(f"[dim]case {r.case} {r.variant}: {r.status.value}[/dim]")

    with executors.make(executor, device, gpus, ray_address, ray_shared) as ex:
        v = verdict.run_on(p, cf, opts, ids, on_result, ex)
    if as_json:
        print(json.dumps({"verdict": v.line(), "passed": v.passed, "geomean_speedup": v.geomean,
                          "geomean_speedup_ragged": v.geomean_ragged, "geomean_pct_limit": v.geomean_pct_limit,
                          "geomean_pct_limit_ragged": v.geomean_pct_limit_ragged,
                          "min_speedup": v.min_speedup, "rows": [r.model_dump(mode="json") for r in v.rows],
                          "wall_s": round(time.perf_counter() - t0, 2)}))
    else:
        if not machine:
            from kopt.cli.output import table

            table(v.rows)
        print(v.line(), flush=True)
    if not v.passed:
        raise typer.Exit(1)


def _current_best(ledger: Path) -> Optional[str]:
    """The top-ranked candidate id of the ledger, if any."""
    if not ledger.exists():
        return None
    from kopt.workspace import ranking

    top = ranking.best(ranking.load_frame(ledger)[0])
    return str(top["candidate_id"]) if top else None
