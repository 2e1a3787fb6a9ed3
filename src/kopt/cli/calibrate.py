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
    """Time the baseline and the candidate against themselves; store the A/A spread in results/."""
    from kopt.candidate import resolve
    from kopt.cli.common import out_console
    from kopt.eval import calibrate
    from kopt.eval.bench import BenchOptions
    from kopt.paths import default_candidate
    from kopt.timing.stats import min_effect

    cases = resolve_cases(CaseSelection(case, False))
    cal = calibrate.run(resolve(candidate or default_candidate()), cases,
                        BenchOptions(device=device, quick=quick, timeout_s=timeout))
    if as_json:
        print(cal.model_dump_json(indent=2))
        return
    c = out_console()
    for e in cal.entries:
        sp = "NA" if e.speedup is None else f"{e.speedup:.4f}"
        ci = "NA" if e.ci is None else f"{e.ci[0]:.4f}-{e.ci[1]:.4f}"
        c.print(f"case {e.case:>2} {e.pair:<8} A/A speedup {sp} CI {ci}")
    c.print(f"device {cal.device}: A/A spread {cal.spread:.4f} -> improvements need >= {min_effect(cal.spread):.2%}")
