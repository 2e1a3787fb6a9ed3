"""The bench library: evaluate a candidate on cases in isolated children, verify, record.

`evaluate` is the one call behind `kopt bench` and `kopt verify`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from kopt.cases import Case
from kopt.isolate import Job, Outcome, run_jobs
from kopt.results import CaseResult, Status

#: A kernel reaching more than this share of the measured copy ceiling is not believed.
IMPLAUSIBLE_FRACTION = 1.15


@dataclass
class BenchOptions:
    """Everything one evaluation run needs besides the candidate and the cases."""

    device: str = "auto"
    cold: bool = True
    graph: bool = False
    timeout_s: float = 600.0
    record: bool = True
    mode: str = "signal"
    seeds: int = 1
    quick: bool = False
    timing: bool = True
    baseline: str = "auto"
    pair: str = "ab"
    config: Optional[dict] = None
    parent_id: Optional[str] = None
    technique: Optional[str] = None
    hypothesis: Optional[str] = None
    ledger: Optional[Path] = None
    keep_dir: Optional[Path] = None
    tag: str = ""
    run_id: Optional[str] = None
    progress: Optional[Callable[[int], None]] = None
    """Called with the number of cases the child has finished (for progress bars)."""
    """Appended to each row's variant label (e.g. `matrix`, `hidden-b5-s141`)."""
    hidden: bool = False
    """Also check a hidden variant of each case (untimed); a failure there fails the case's row.
    Verdicts add hidden rows of their own (kopt.verdict), so they leave this off."""
    extra: dict = field(default_factory=dict)


def resolve_device(device: str) -> str:
    """auto -> cuda when a GPU is visible, else cpu; cuda without a GPU is a usage error."""
    from kopt.errors import UsageError

    if device not in ("auto", "cuda", "cpu"):
        raise UsageError(f"unknown device {device!r}; use auto, cuda or cpu")
    if device == "cpu":
        return "cpu"
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if device == "cuda":
        raise UsageError("--device cuda but no CUDA device is visible")
    return "cpu"


def _fresh_seed() -> int:
    return int.from_bytes(os.urandom(4), "little") % 1_000_000_007


def evaluate(path: Path, cases: list[Case], opts: BenchOptions,
             on_result: Optional[Callable[[CaseResult], None]] = None) -> list[CaseResult]:
    """Evaluate one candidate on each case in isolated children; rows are appended to the ledger."""
    from kopt import candidate, ledger, paths
    from kopt.integrity import static_check

    path = candidate.resolve(path)
    if opts.record:
        ledger.check_writable(opts.ledger or paths.ledger_file())
    device = resolve_device(opts.device)
    chash = candidate.content_hash(path)
    findings = static_check(path)
    commit = _git_head(path.parent)
    errors = [f for f in findings if f.severity == "error"]
    warns = [f"{f.code} {Path(f.file).name if f.file else ''}:{f.line}: {f.message}" for f in findings
             if f.severity != "error"]
    run_id = opts.run_id or uuid.uuid4().hex[:12]
    rows = [CaseResult(row_id=uuid.uuid4().hex[:16], run_id=run_id, mode=opts.mode, candidate_path=_shown(path),
                       candidate_hash=chash, candidate_id=chash[:12], parent_id=opts.parent_id,
                       technique=opts.technique, hypothesis=opts.hypothesis, config=opts.config,
                       case=case.id, variant=case.variant.label() + (f"-{opts.tag}" if opts.tag else ""),
                       commit=commit, device=device, static_warnings=warns) for case in cases]
    if errors:
        for r in rows:
            r.status, r.message = Status.static_violation, "; ".join(f"{f.code}: {f.message}" for f in errors)[:500]
    else:
        _run_cases(path, cases, device, opts, rows)
    for case, r in zip(cases, rows):
        if not errors and opts.hidden and r.correct:
            _check_hidden(path, case, device, opts, r)  # records overhead_s["hidden"]
        if opts.record:
            ledger.append(opts.ledger or paths.ledger_file(), [r])
        if on_result:
            on_result(r)
    return rows


def _shown(path: Path) -> str:
    """The candidate path as rows record it: relative to the workspace when inside it."""
    from kopt.paths import workspace

    try:
        return str(path.relative_to(workspace()))
    except ValueError:
        return str(path)


def _make_job(path: Path, case: Case, device: str, opts: BenchOptions, r: CaseResult) -> Job:
    seeds = [_fresh_seed() for _ in range(max(opts.seeds, 1))]
    r.seed = seeds[0]
    work = Path(tempfile.mkdtemp(prefix="kopt-eval-"))
    return Job(candidate_path=str(path), case=case, device=device, seeds_correct=seeds,
               seeds_timing=[seeds[0], _fresh_seed()], refill_seed=_fresh_seed(),
               do_timing=opts.timing, cold=opts.cold, graph=opts.graph, quick=opts.quick,
               baseline=opts.baseline, pair=opts.pair, config=opts.config, out_dir=str(work))


def _run_cases(path: Path, cases: list[Case], device: str, opts: BenchOptions, rows: list[CaseResult]) -> None:
    """Children evaluate the cases (one child for all unless one dies); then each is verified here."""
    jobs = [_make_job(path, c, device, opts, r) for c, r in zip(cases, rows)]
    try:
        outcomes = run_jobs(jobs, opts.timeout_s, opts.progress)
        for case, r, job, oc in zip(cases, rows, jobs, outcomes):
            t0 = time.perf_counter()
            r.overhead_s["child_wall"] = round(oc.wall_s, 3)
            _fill_from_child(r, oc, device)
            if oc.result and oc.failure() is None:
                _verify_outputs(r, case, device, Path(job.out_dir), opts.baseline)
            _derive(r, case, device)
            r.overhead_s["verify"] = round(time.perf_counter() - t0, 3)
    finally:
        for case, r, job in zip(cases, rows, jobs):
            if opts.keep_dir:
                shutil.copytree(job.out_dir, Path(opts.keep_dir) / f"case{case.id}-{r.row_id}", dirs_exist_ok=True)
            shutil.rmtree(job.out_dir, ignore_errors=True)


def _run_case(path: Path, case: Case, device: str, opts: BenchOptions, r: CaseResult) -> None:
    """One case in its own child (used for hidden variants)."""
    _run_cases(path, [case], device, opts, [r])


def hidden_variant(case: Case) -> Case:
    """A shape the candidate has never been shown: 3 more sequences, 13 more cache slots, ragged lengths."""
    c = case.model_copy(update={"batch": case.batch + 3, "seqlen_k": case.seqlen_k + 13})
    return c.with_variant(seqlens="ragged")


def _check_hidden(path: Path, case: Case, device: str, opts: BenchOptions, r: CaseResult) -> None:
    """Correctness (untimed) on the hidden variant; a candidate special-casing the table shapes fails here."""
    from dataclasses import replace

    hc = hidden_variant(case)
    h = CaseResult(row_id=r.row_id, case=case.id, variant=hc.variant.label())
    _run_case(path, hc, device, replace(opts, timing=False, keep_dir=None), h)
    r.overhead_s["hidden"] = round(h.overhead_s.get("child_wall", 0.0) + h.overhead_s.get("verify", 0.0), 3)
    if not h.correct:
        r.status, r.correct, r.improvement = h.status, False, None
        r.message = (f"hidden variant (batch {hc.batch}, seqlen_k {hc.seqlen_k}, {hc.variant.label()}): "
                     f"{h.status.value}: {h.message}")[:500]


def _fill_from_child(r: CaseResult, oc: Outcome, device: str) -> None:
    res = oc.result
    r.device = res.device_name if res else device
    if res:
        r.backend, r.compile_s, r.versions, r.plan = res.backend, res.compile_s, res.versions, res.plan
        r.timing, r.ref_timing, r.ref = res.timing, res.ref_timing, res.ref_name
        r.speedup_ci = res.speedup_ci
        r.overhead_s.update({k: round(v, 3) for k, v in res.overhead_s.items()})
        if res.timing:
            r.runtime_ms = res.timing.median_ms
        if res.ref_timing:
            r.ref_runtime_ms = res.ref_timing.median_ms
        r.speedup = res.speedup
        r.message = res.message
    fail = oc.failure()
    if fail:
        r.status, r.message = fail[0], fail[1]
    elif res and res.baseline_failed:
        r.status = Status.baseline_error  # the candidate ran; SPEEDUP is NA because the baseline did not
    # Compilation happens on first use: a candidate whose first call (or `prepare`) failed did not compile.
    first_call_failed = fail is not None and res is not None and res.compile_s is None
    r.compiled = r.status.compiled and res is not None and res.phase not in ("start", "import") \
        and not first_call_failed


def _verify_outputs(r: CaseResult, case: Case, device: str, work: Path, prefer: str) -> None:
    """Check every saved output against the fp32 reference of the same seed (computed here)."""
    import torch

    from kopt import baselines, verify
    from kopt.reference import reference
    from kopt.workload import make_workload

    base = baselines.pick(case, device, prefer)
    if r.ref == "NA":  # untimed runs: the baseline still ran, to set the tolerance
        r.ref = base.name
    checks = []
    cache: dict[int, tuple] = {}
    for so in r_outputs(work):
        if so.seed not in cache:
            w = make_workload(case, so.seed, device)
            try:
                b = base.fn(w)
            except Exception as e:  # the baseline failing must not pass or fail the candidate silently
                b = reference(w).to(w.q.dtype)
                r.message = (r.message + f"; tolerance baseline {base.name} failed ({type(e).__name__}),"
                             " used the reference rounded to the dtype").strip("; ")
            cache = {so.seed: (w, reference(w), b)}
        w, ref, b = cache[so.seed]
        out = torch.load(work / so.file, weights_only=True)
        chk = verify.check_output(out, ref, b, w.q)
        if chk.status == Status.incorrect_numerical and so.kind in ("spot", "refill"):
            chk.status, chk.detail = Status.stale_output, f"{so.kind} output wrong: {chk.detail}"
        checks.append(chk)
    status, r.validation = verify.summarize(checks)
    if status != Status.ok:
        r.status, r.message = status, r.validation.detail
    elif not checks:
        r.status, r.message = Status.runtime_error, "no output was produced"
    if device == "cuda":
        del cache
        torch.cuda.empty_cache()


def r_outputs(work: Path):
    """The outputs the child saved (from its result.json)."""
    from kopt.isolate import read_result

    res = read_result(work)
    return res.outputs if res else []


def _derive(r: CaseResult, case: Case, device: str) -> None:
    """Correct flag, bandwidth, %peak, the implausibility guard and the improvement flag."""
    from kopt import calibrate, hardware, stats
    from kopt.workload import bytes_moved

    r.correct = r.status in (Status.ok, Status.baseline_error) and r.compiled
    if r.runtime_ms:
        r.gbps = bytes_moved(case) / (r.runtime_ms * 1e-3) / 1e9
        ceiling = hardware.copy_ceiling_gbps(device) if device == "cuda" else None
        if ceiling:
            r.pct_peak = 100.0 * r.gbps / ceiling
            if r.correct and r.timing and r.timing.cold and r.gbps > IMPLAUSIBLE_FRACTION * ceiling:
                r.status, r.correct = Status.implausible, False
                r.message = f"{r.gbps:.0f} GB/s exceeds {IMPLAUSIBLE_FRACTION:.2f} x the measured copy ceiling {ceiling:.0f} GB/s"
    if r.correct and r.speedup is not None and r.speedup_ci is not None:
        r.improvement = stats.is_improvement(r.speedup, r.speedup_ci, calibrate.aa_spread(r.device))


def _git_head(start: Path) -> Optional[str]:
    """Short commit of the workspace: $KOPT_COMMIT when set (a GPU host given a copy of the tree,
    whose own git metadata, if any, need not match what was copied), else the HEAD of the
    repository holding the candidate, else None."""
    import os
    import subprocess

    pinned = os.environ.get("KOPT_COMMIT", "").strip()[:12]
    if pinned:
        return pinned
    try:
        p = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=start, capture_output=True,
                           text=True, timeout=5)
        head = p.stdout.strip() if p.returncode == 0 else ""
    except (OSError, subprocess.TimeoutExpired):
        head = ""
    return head or None
