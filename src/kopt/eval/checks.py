"""Correctness: candidate error against the fp32 reference, tolerance from the baseline's own error."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from kopt.records import Status, Validation

#: A kernel reaching more than this share of the measured ceiling is not believed.
IMPLAUSIBLE_FRACTION = 1.15

#: Unit roundoff of the output dtypes; the floor allows two ulps at the output's scale.
_EPS = {"torch.float16": 2.0 ** -10, "torch.bfloat16": 2.0 ** -7, "torch.float32": 2.0 ** -23}


@dataclass
class Check:
    """Outcome of one output check."""

    status: Status
    err: float | None = None
    base_err: float | None = None
    tol: float | None = None
    detail: str = ""


def tolerance(ref, base_err: float, dtype) -> float:
    """2 x the baseline's error + a floor of two ulps of the dtype at the reference's max magnitude."""
    eps = _EPS.get(str(dtype), 2.0 ** -10)
    return 2.0 * base_err + 2.0 * eps * float(ref.abs().max()) + 1e-6


def check_output(out, ref, base_out, like, base_err: Optional[float] = None) -> Check:
    """Compare one candidate output to the reference; `like` is the query tensor (shape/dtype expected). The
    tolerance comes from the baseline's output `base_out`, or from its error `base_err` when given instead."""
    import torch

    if not isinstance(out, torch.Tensor):
        return Check(Status.incorrect_shape, detail=f"run returned {type(out).__name__}, not a tensor")
    if tuple(out.shape) != tuple(like.shape):
        return Check(Status.incorrect_shape, detail=f"shape {tuple(out.shape)} != {tuple(like.shape)}")
    if out.dtype != like.dtype:
        return Check(Status.incorrect_dtype, detail=f"dtype {out.dtype} != {like.dtype}")
    outf = out.detach().float().to(ref.device)
    bad = ~torch.isfinite(outf)
    if bool(bad.any()):
        return Check(Status.nan_inf, detail=f"{int(bad.sum())} NaN/Inf elements (unwritten output is poisoned with "
                                            f"NaN)")
    if base_err is None:
        base_err = float((base_out.float().to(ref.device) - ref).abs().max())
    err = float((outf - ref).abs().max())
    tol = tolerance(ref, base_err, like.dtype)
    if err > tol:
        return Check(Status.incorrect_numerical, err, base_err, tol,
                     f"max abs err {err:.3g} > tolerance {tol:.3g} (baseline err {base_err:.3g})")
    return Check(Status.ok, err, base_err, tol)


def summarize(checks: list[Check]) -> tuple[Status, Validation]:
    """Fold several trials into one status (the first failure wins) and a Validation record."""
    failed = next((c for c in checks if c.status != Status.ok), None)
    errs = [c.err for c in checks if c.err is not None]
    bases = [c.base_err for c in checks if c.base_err is not None]
    tols = [c.tol for c in checks if c.tol is not None]
    v = Validation(
        correct=failed is None and bool(checks),
        trials=len(checks),
        max_abs_err=max(errs) if errs else None,
        baseline_err=max(bases) if bases else None,
        tolerance=min(tols) if tols else None,
        detail=failed.detail if failed else "",
    )
    return (failed.status if failed else Status.ok), v


def check_saved(case, device: str, base, outputs, load, cache: dict | None = None,
                base_once: bool = False) -> tuple[list[Check], list[str]]:
    """Each saved output (seed, kind, file) against the fp32 reference of its seed, computed here.

    load(saved) returns the output tensor. The tolerance comes from the baseline `base` on the same
    inputs, or from the reference rounded to the dtype where the baseline fails (the exception type
    names are returned). A wrong output of a timed input (`spot`) or of the refilled buffers
    (`refill`) is stale_output. `cache` (seed -> (workload, reference, baseline output)) may be
    shared between calls; None keeps only the latest seed (one workload in memory).

    base_once (the CPU): the baseline runs on the first seed only, and its error relative to the reference's
    largest magnitude sets the tolerance of the other seeds (same shape, same input distribution). The torch CPU
    reference is 10x slower than the fp32 reference and the candidate on long caches (8.0 s against 1.2 s and 0.8 s
    on 131072 keys of 4 heads): run per seed it was most of a CPU verdict's checking time."""
    from kopt.reference import reference
    from kopt.workload import make_workload

    memo = {} if cache is None else cache
    checks, base_failed, rel = [], [], None
    for so in outputs:
        if so.seed not in memo:
            w = make_workload(case, so.seed, device)
            ref = reference(w)
            b = None
            if rel is None or not base_once:
                try:
                    b = base.fn(w)
                except Exception as e:  # the baseline failing must not pass or fail the candidate silently
                    b = ref.to(w.q.dtype)
                    base_failed.append(type(e).__name__)
            if cache is None:
                memo.clear()
            memo[so.seed] = (w, ref, b)
        w, ref, b = memo[so.seed]
        scale = float(ref.abs().max()) or 1.0
        if b is not None and rel is None:
            rel = float((b.float().to(ref.device) - ref).abs().max()) / scale
        err = None if b is not None else rel * scale
        chk = check_output(load(so), ref, b, w.q, base_err=err)
        if chk.status == Status.incorrect_numerical and so.kind in ("spot", "refill"):
            chk.status, chk.detail = Status.stale_output, f"{so.kind} output wrong: {chk.detail}"
        checks.append(chk)
    return checks, base_failed


def check_outputs(case, device: str, base, outputs, folder: Path,
                  cache: Optional[dict] = None) -> tuple[Status, Validation, list[str]]:
    """The parent's check of a child's saved outputs (files in `folder`): each against the fp32 reference of
    its seed (check_saved), folded into (status, Validation, the baseline's failures); none at all is a
    runtime_error. Used for every bench and every tuned config alike."""
    import torch

    checks, base_failed = check_saved(case, device, base, outputs,
                                      lambda so: torch.load(Path(folder) / so.file, weights_only=True), cache,
                                      base_once=device == "cpu")
    status, v = summarize(checks)
    if status == Status.ok and not checks:
        status, v.detail = Status.runtime_error, "no output was produced"
    return status, v, base_failed


def implausible(gbps: float, ceiling: Optional[float]) -> bool:
    """Faster than a decode call can be: more than IMPLAUSIBLE_FRACTION x the measured ceiling."""
    return bool(ceiling) and gbps > IMPLAUSIBLE_FRACTION * ceiling


def implausible_message(gbps: float, ceiling: float, what: str) -> str:
    """Why a row is `implausible`: its bandwidth against the ceiling it exceeds (`what` names that ceiling)."""
    return f"{gbps:.0f} GB/s exceeds {IMPLAUSIBLE_FRACTION:.2f} x the {what} {ceiling:.0f} GB/s"
