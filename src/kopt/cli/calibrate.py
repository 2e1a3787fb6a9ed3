"""`kopt calibrate`: A/A noise floor per device."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from kopt.cli import options
from kopt.cli.options import CaseSelection, resolve_cases


def command(
    case: str = typer.Option("10,12", "--case", "-c", help="Cases for the A/A runs."),
    candidate: Optional[Path] = typer.Option(None, "--candidate", help="Candidate for the candidate-vs-itself run."),
    device: options.Device = "auto",
    quick: bool = typer.Option(False, "--quick", help="Fewer samples (smoke runs)."),
    timeout: float = typer.Option(600.0, "--timeout", min=1.0, help="Wall-clock limit per case, seconds."),
    as_json: bool = typer.Option(False, "--json", help="Print the calibration as JSON."),
) -> None:
    """Time the baseline and the candidate against themselves; store the A/A spread in results/.

    One `AA:` line per run (SPEEDUP of a function over itself: 1 is no noise), then `CALIBRATION:<device> SPREAD:...`.
    """
    from kopt.eval import calibrate
    from kopt.eval.bench import BenchOptions
    from kopt.paths import default_candidate, relative
    from kopt.records import fmt_na, token
    from kopt.store import resolve_candidate as resolve
    from kopt.store.calibration import calibration_file
    from kopt.timing.stats import min_effect

    cases = resolve_cases(CaseSelection(case, False))
    cal = calibrate.run(resolve(candidate or default_candidate()), cases,
                        BenchOptions(device=device, quick=quick, timeout_s=timeout))
    if as_json:
        print(cal.model_dump_json(indent=2))
        return
    for e in cal.entries:  # KEY:VALUE lines, as every line kopt prints for agents
        sp = "NA" if e.speedup is None else f"{e.speedup:.4f}x"
        ci = "NA" if e.ci is None else f"{e.ci[0]:.4f}-{e.ci[1]:.4f}"
        print(f"AA:{e.pair} CASE:{e.case} SPEEDUP:{sp} SPEEDUP_CI:{ci} SPREAD:{fmt_na(e.spread)}", flush=True)
    print(f"CALIBRATION:{token(cal.device)} SPREAD:{cal.spread:.4f} MIN_EFFECT:{min_effect(cal.spread):.4f} "
          f"FILE:{relative(calibration_file(cal.device))}", flush=True)
