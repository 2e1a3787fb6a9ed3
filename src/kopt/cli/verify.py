"""`kopt verify [--candidate PATH]`: the Verdict. A machine line per run and one aggregate VERDICT line."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from kopt.cli import options
from kopt.cli.options import ExecutorOpts


def command(
    path: Optional[Path] = typer.Argument(None, hidden=True, help="Candidate file (older form of --candidate)."),
    candidate: options.Candidate = None,
    case: options.Case = None,
    device: options.Device = "auto",
    parent: Optional[str] = typer.Option(None, "--parent",
                                         help="Parent candidate id (default: the current best on this device)."),
    technique: Optional[str] = typer.Option(None, "--technique", help="What this candidate tries (e.g. split-kv)."),
    hypothesis: Optional[str] = typer.Option(None, "--hypothesis", help="The prediction being tested."),
    config: options.Config = None,
    machine: options.Machine = False,
    as_json: options.Json = False,
    timeout: float = typer.Option(600.0, "--timeout", min=1.0, help="Wall-clock limit per run, seconds."),
    quick: bool = typer.Option(False, "--quick", help="The quick verdict, a screen (<= 3 min on a 2-core CPU, <= 60 s "
                                                      "on an H200): the named cases and matrix rows that fit "
                                                      "(on the CPU: caches up to 32 MiB), one seed per matrix row, 2 "
                                                      "hidden shapes, 4 held-out draws, quick timing, no reigning "
                                                      "pairing; rows of mode screen, VERDICT:screen. Never judged as "
                                                      "a verdict: run the full one to log an improvement."),
    quick_timing: bool = typer.Option(False, "--quick-timing", help="A full verdict with fewer timing samples "
                                                                    "(smoke runs only)."),
    budget: Optional[float] = typer.Option(None, "--budget", min=1.0,
                                           help="Stop after SECONDS: no row starts after it; VERDICT:stopped and "
                                                "NOT_RUN say what did not run (a stopped run is no verdict)."),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="Spread the runs over N GPUs of this host (or 'all')."),
    baseline: str = typer.Option("auto", "--baseline", help="auto | fa2 | fa2-paged | fa3 | flashinfer | torch (kopt "
                                                            "bench --baseline)."),
    heldout: Optional[int] = typer.Option(None, "--heldout", min=0, max=256,
                                          help="Held-out shapes drawn from bench/workloads.yaml and timed "
                                               "(default: verify.heldout of bench/cases.yaml, 12)."),
    heldout_seed: Optional[int] = typer.Option(None, "--heldout-seed", min=0,
                                               help="Seed of the held-out draw (default: a fresh one, recorded); "
                                                    "the same seed draws the same shapes."),
    against: Optional[Path] = typer.Option(None, "--against", help="Reigning candidate to time on the same held-out "
                                                                   "draws (default: the source from git of the "
                                                                   "best on this device)."),
    no_pair: bool = typer.Option(False, "--no-pair", help="Do not time the reigning candidate on the held-out draws."),
    e2e: bool = typer.Option(False, "--e2e", help="Also run a small `kopt e2e` check (the candidate as a decoder's "
                                                  "attention): the verdict passes only when it passes too."),
    executor: str = ExecutorOpts.executor,
    ray_address: Optional[str] = ExecutorOpts.ray_address,
    ray_shared: bool = ExecutorOpts.ray_shared,
) -> None:
    """Time every named perf case cold, run the correctness matrix and hidden variants, time held-out draws from the
    workload library (and the reigning candidate on the same draws); record verdict rows."""
    from kopt import executor as executors
    from kopt.baselines import BASELINE_CHOICES
    from kopt.cases import load_file, parse_ids, select
    from kopt.cli.common import err_console
    from kopt.cli.output import deadline, progress_line
    from kopt.eval import verdict
    from kopt.eval.bench import BenchOptions
    from kopt.eval.jobs import fresh_seed
    from kopt.hardware import device_label, resolve_device
    from kopt.paths import default_candidate, ledger_file
    from kopt.records import machine_line
    from kopt.store import resolve_candidate as resolve

    t0 = time.perf_counter()
    options.output_mode(machine, as_json)
    path = options.candidate_arg(candidate, path)
    if against is not None and no_pair:
        from kopt.errors import UsageError

        raise UsageError("--against and --no-pair are exclusive: --against names the candidate to pair with")
    cf = load_file()
    ids = parse_ids(case)
    if ids:
        select(cf.cases, ids)  # unknown ids -> usage error listing the valid ones
    p = resolve(path or default_candidate())
    reigning = resolve(against) if against else None
    seed = fresh_seed() if heldout_seed is None else heldout_seed
    dev = resolve_device(device)
    best = current_best(ledger_file(), device_label(dev))
    opts = BenchOptions(device=device, cold=True, timeout_s=timeout, quick=quick_timing,
                        config=options.config_for(config, p), baseline=options.choice(baseline, BASELINE_CHOICES,
                                                                                    "--baseline"),
                        parent_id=parent or best, technique=technique, hypothesis=hypothesis, heldout_seed=seed,
                        deadline=deadline(budget, t0))
    n_held = (verdict.QUICK_HELDOUT if quick else cf.verify.heldout) if heldout is None else heldout
    held = verdict.heldout_draw(n_held, seed, dev)
    err = err_console()
    if quick:
        out = "; ".join(f"{g}: {', '.join(names)}" for g, names in verdict.left_out(cf, dev, ids).items())
        print(f"kopt verify --quick: a screen, not a verdict{' (left out on ' + dev + ': ' + out + ')' if out else ''}",
              file=sys.stderr, flush=True)
    done = [0]

    def on_result(r):
        done[0] += 1
        if machine:
            print(machine_line(r), flush=True)
        progress_line("verify", r, done[0], 0, t0)

    with executors.make(executor, device, gpus, ray_address, ray_shared) as ex:
        v = verdict.run_on(p, cf, opts, ids, on_result, ex, held, quick=quick)
    ref_rows = []
    if v.heldout and not no_pair and not quick and not v.stopped:
        ref_rows = _time_reigning(p, reigning, best, v, held, opts, err, on_result if machine else None)
    e2e_res = _e2e(p, device, timeout, v, machine) if e2e else None
    passed = v.passed and (e2e_res is None or e2e_res.passed)
    line = v.line()
    if e2e_res is not None:  # the e2e check is part of the verdict: it fails with it
        line = ("VERDICT:fail" + line[len("VERDICT:pass"):] if not passed and line.startswith("VERDICT:pass")
                else line) + f" E2E:{'pass' if e2e_res.passed else 'fail'}"
    if as_json:
        print(json.dumps({"verdict": line, "passed": passed, "outcome": v.outcome, "not_run": v.not_run,
                          "geomean_speedup": v.geomean,
                          "geomean_speedup_ragged": v.geomean_ragged, "geomean_pct_limit": v.geomean_pct_limit,
                          "geomean_pct_limit_ragged": v.geomean_pct_limit_ragged,
                          "geomean_speedup_seed": v.geomean_seed, "geomean_speedup_heldout": v.geomean_heldout,
                          "geomean_pct_limit_heldout": v.geomean_pct_limit_heldout,
                          "min_speedup_heldout": v.min_speedup_heldout, "heldout_seed": v.heldout_seed,
                          "heldout_vs_best": v.vs_best, "best": v.best_id,
                          "min_speedup": v.min_speedup, "rows": [r.model_dump(mode="json") for r in v.rows],
                          "reigning_rows": [r.model_dump(mode="json") for r in ref_rows],
                          "e2e": e2e_res.model_dump(mode="json") if e2e_res else None,
                          "wall_s": round(time.perf_counter() - t0, 2)}))
    else:
        if not machine:
            from kopt.cli.output import table

            table(v.rows)
        if e2e_res is not None:
            print(e2e_res.line(), flush=True)
        print(line, flush=True)
    if v.stopped:
        print(f"kopt verify: the budget of {budget:g} s was spent; not run: "
              + ", ".join(f"{n} {g} row(s)" for g, n in v.not_run.items()) + " (a stopped run is no verdict)",
              file=sys.stderr)
    if v.failed_rows or not v.rows or (e2e_res is not None and not e2e_res.passed):
        raise typer.Exit(1)


def _e2e(p: Path, device: str, timeout: float, v, machine: bool):
    """The small e2e check of the verdict (kopt.e2e.small_check), its row recorded with the verdict's run id."""
    from kopt import e2e
    from kopt.cli.common import err_console

    o = e2e.small_check(device)
    if not machine:
        err_console().print(f"[dim]e2e check: {o.model} x{o.layers} layers, batch {o.batch}, {o.tokens} tokens[/dim]")
    res = e2e.run(p, o, timeout)
    e2e.record(res, v.rows[0].run_id if v.rows else None)
    return res


def _time_reigning(p: Path, reigning: Optional[Path], best: Optional[str], v, held, opts, err, on_result) -> list:
    """The reigning candidate timed on the verdict's held-out draws; sets v.vs_best / v.best_id (NA with a
    reason on stderr when it cannot be had)."""
    import tempfile

    from kopt import candidate
    from kopt.eval import verdict
    from kopt.paths import workspace
    from kopt.policy import ranking
    from kopt.store.vcs import export_candidate

    me = candidate.candidate_id(p)
    with tempfile.TemporaryDirectory(prefix="kopt-reigning-") as tmp:
        if reigning is None:
            if not best or best == me:
                err.print("held-out pairing: NA (" + ("this candidate is the best" if best else
                                                      "no best candidate yet") + ")")
                return []
            reigning = export_candidate(workspace(), best, Path(tmp))
            if reigning is None:
                err.print(f"held-out pairing: NA (no commit holds the best candidate {best}; pass --against PATH)")
                return []
        if candidate.candidate_id(reigning) == me:
            err.print("held-out pairing: NA (--against is this candidate)")
            return []
        err.print(f"held-out pairing: timing the reigning candidate {candidate.candidate_id(reigning)} on the same "
                  f"{len(v.heldout)} draws")
        v.best_id = candidate.candidate_id(reigning)
        rows = verdict.time_reigning(reigning, held, opts, v.heldout[0].run_id or "", on_result)
    v.vs_best = ranking.heldout_ratio([r.model_dump(mode="json") for r in v.heldout],
                                      [r.model_dump(mode="json") for r in rows])
    return rows


def current_best(ledger: Path, device: Optional[str]) -> Optional[str]:
    """The top-ranked candidate id among the ledger's rows measured on `device` (a verdict's parent and the
    candidate its held-out draws are paired with: a rank over another device's times, or a CPU's, says nothing
    about this one), if any; every row where the device's name cannot be read (None)."""
    if not ledger.exists():
        return None
    from kopt.policy import ranking

    top = ranking.best_on(ledger, device)
    return str(top["candidate_id"]) if top else None
