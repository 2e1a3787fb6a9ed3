"""The bench library: evaluate a candidate on cases in isolated children, verify, record.

`evaluate` is the one call behind `kopt bench` and `kopt verify`.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from kopt.cases import Case, hidden_variant
from kopt.eval.child import Child, run_jobs
from kopt.eval.jobs import Job, Outcome, fresh_seed
from kopt.hardware import resolve_device
from kopt.records import CaseResult, FlushKind, Replay, Status


@dataclass
class BenchOptions:
    """Everything one evaluation run needs besides the candidate and the cases."""

    device: str = "auto"
    cold: bool = True
    flush: FlushKind = "read"
    """How the cold flush evicts L2 (kopt.timing.TimingOptions.flush)."""
    graph: bool = False
    replay: Replay = "graph"
    """Device-only cold calls as CUDA-graph replays where both sides capture, or on the stream
    (kopt.timing.TimingOptions.replay)."""
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
    tag: str = ""
    """Appended to each row's variant label (e.g. `matrix`; `hidden-b{batch}-s{seqlen_k}` names each case's shape)."""
    run_id: Optional[str] = None
    progress: Optional[Callable[[int], None]] = None
    """Called with the number of cases the child has finished (for progress bars)."""
    peers: tuple[str, ...] = ()
    """kopt peers: time the candidate against each of these peers (kopt.eval.peers) instead of `baseline`."""
    hidden: bool = False
    """Also check a hidden variant of each case (untimed); a failure there fails the case's row.
    Verdicts add hidden rows of their own (kopt.eval.verdict), so they leave this off."""
    timing_sets: Optional[int] = None
    """Input sets the timed calls rotate over (each its own allocation, so a figure averages that many placements
    of the inputs in device memory; `kopt bench --timing-sets`). None: 4 on a GPU (since the tenth session: with
    two, one of five bench --all runs on the H200 read R1 2.24% under the five's median while each run's CI was
    0.1%), 2 on the CPU (its caches are far smaller than any case's inputs, and every set is generated twice, in
    the child and again for the check: on the large cases each costs seconds)."""
    verdict_rows: Optional[int] = None
    """mode=verdict: the rows the whole verify run writes (set by kopt.eval.verdict.plan, kept on each row)."""
    kept_child: bool = True
    """Take a started child a previous run left (kopt.eval.warm) and leave one for the next. The Verdict turns
    it off: it runs only in children started by its own run, never in a process that waited between runs."""
    heldout_seed: Optional[int] = None
    """The seed of the held-out draw a run's held-out cases came from (kept on their rows)."""
    paired_run: Optional[str] = None
    """mode=heldout: the verify run whose held-out draws the reigning candidate is timed on."""
    deadline: Optional[float] = None
    """A time.perf_counter() time (`--budget`): no case starts after it and the case running at it is stopped;
    the cases not run get no row (evaluate returns the rows of the cases that ran, in order)."""


def _preload(device: str) -> None:
    """Import what checking the child's outputs needs (torch, the reference) while the child runs; on
    CUDA also create this process's context (~0.15 s on an H200; no kernel runs, so the child's
    timing is undisturbed)."""
    try:
        import torch

        from kopt import baselines  # noqa: F401  (imported here, while the child runs)
        from kopt.eval import checks  # noqa: F401

        if device == "cuda":
            torch.cuda.mem_get_info()  # needs the context, so creates it (torch.cuda.init() alone does not)
    except Exception:  # the main thread imports again and reports whatever failed
        pass


def warm_hints(path: Path, device: str) -> tuple[str, ...]:
    """What an evaluation child may prepare before its jobs arrive: its CUDA context unless the run is
    on the CPU, and the tilelang import when the candidate's sources name tilelang (a cheap text test;
    a wrong guess costs time, never correctness)."""
    from kopt import candidate

    hints = [] if device == "cpu" else ["cuda"]
    try:  # the candidate file alone first: parsing its imports (~25 ms) would delay the child's start
        names = lambda f: "tilelang" in Path(f).read_text(errors="replace")  # noqa: E731
        if names(path) or any(names(f) for f in candidate.sources(path)[1:]):
            hints.append("tilelang")
    except OSError:  # a missing candidate: the run reports it in one line
        pass
    return tuple(hints)


def evaluate(path: Path, cases: list[Case], opts: BenchOptions,
             on_result: Optional[Callable[[CaseResult], None]] = None,
             child: Optional[Child] = None) -> list[CaseResult]:
    """Evaluate one candidate on each case in isolated children; rows are appended to the ledger. `child`: one
    this run started earlier (a Verdict starts its groups' children before its compiles), ended here too."""
    # first: its start-up (the interpreter, `import torch`, its CUDA context) overlaps the preparation below
    from kopt.eval.warm import keep_seconds

    given = child is not None
    child = child.claim() if given else Child(warm=warm_hints(path, opts.device), take_kept=opts.kept_child)
    try:
        device = resolve_device(opts.device)
        if opts.kept_child and not given:  # a started child for the next run, warming up beside this run's own
            child.keep(keep_seconds(device))
        return _evaluate(path, cases, opts, device, on_result, child)
    finally:
        child.close()  # a run that never sent it jobs (a static violation, an error, Ctrl-C) ends it here


def evaluate_peers(path: Path, cases: list[Case], opts: BenchOptions, peers: Optional[list[str]] = None,
        on_result: Optional[Callable[[CaseResult], None]] = None) -> list[CaseResult]:
    """`kopt peers`: evaluate the candidate against every peer (default: all of kopt.baselines.PEERS) on each case."""
    from dataclasses import replace

    from kopt.baselines import PEERS
    from kopt.eval.peers import check_names

    names = check_names(list(peers) if peers else list(PEERS))
    if resolve_device(opts.device) == "cuda":
        from kopt.eval.prewarm import warm_each

        warm_each([(Path(path), opts.config)] + [(Path(n), None) for n in names if n not in PEERS], cases, "peers")
    return evaluate(path, cases, replace(opts, mode="peers", peers=tuple(names), hidden=False), on_result)


def _evaluate(path: Path, cases: list[Case], opts: BenchOptions, device: str,
              on_result: Optional[Callable[[CaseResult], None]], child: Child) -> list[CaseResult]:
    from kopt import candidate, paths
    from kopt.integrity import static_check
    from kopt.store import head_short, ledger

    path = candidate.resolve(path)
    led = paths.ledger_file()
    if opts.record:
        ledger.check_writable(led)
    chash = candidate.content_hash(path)
    findings = static_check(path)
    commit = head_short(path.parent)
    errors = [f for f in findings if f.severity == "error"]
    warns = [f"{f.code} {Path(f.file).name if f.file else ''}:{f.line}: {f.message}" for f in findings
             if f.severity != "error"]
    run_id = opts.run_id or uuid.uuid4().hex[:12]
    named = paths.recorded(path)  # once a run, not once a case
    rows = [CaseResult(row_id=uuid.uuid4().hex[:16], run_id=run_id, mode=opts.mode, candidate_path=named,
                       candidate_hash=chash, candidate_id=candidate.short_id(chash), parent_id=opts.parent_id,
                       technique=opts.technique, hypothesis=opts.hypothesis, config=opts.config,
                       case=case.id, case_kind=case.kind, variant=row_label(case, opts.tag),
                       model=case.model, shape=case.shape_label() if case.model else None,
                       heldout_seed=opts.heldout_seed if case.kind == "heldout" else None, paired_run=opts.paired_run,
                       commit=commit, device=device, static_warnings=warns, verdict_rows=opts.verdict_rows)
            for case in cases]

    def done(case: Case, r: CaseResult) -> None:  # a case's row is final: record it and print its line now
        if not errors and opts.hidden and r.correct:
            _check_hidden(path, case, device, opts, r)  # records overhead_s["hidden"]
        if opts.record:
            ledger.append(led, [r])
        if on_result:
            on_result(r)

    if errors:
        for case, r in zip(cases, rows):
            r.status, r.message = Status.static_violation, "; ".join(f"{f.code}: {f.message}" for f in errors)[:500]
            done(case, r)
        return rows
    ran = _run_cases(path, cases, device, opts, rows, child, done)
    return rows[:ran]


def row_label(case: Case, tag: str) -> str:
    """A row's variant label: the case variant plus the tag, whose {batch} / {seqlen_k} are this case's."""
    return case.variant.label() + (f"-{tag.format(batch=case.batch, seqlen_k=case.seqlen_k)}" if tag else "")


def _make_job(path: Path, case: Case, device: str, opts: BenchOptions, r: CaseResult) -> Job:
    seeds = [fresh_seed() for _ in range(max(opts.seeds, 1))]
    r.seed, r.timing_sets = seeds[0], max(opts.timing_sets or (2 if device == "cpu" else 4), 2)
    work = Path(tempfile.mkdtemp(prefix="kopt-eval-"))
    return Job(candidate_path=str(path), case=case, device=device, seeds_correct=seeds,
               seeds_timing=[seeds[0]] + [fresh_seed() for _ in range(r.timing_sets - 1)], refill_seed=fresh_seed(),
               do_timing=opts.timing, cold=opts.cold, flush=opts.flush, graph=opts.graph, replay=opts.replay,
               quick=opts.quick,
               baseline=opts.baseline, pair=opts.pair, config=opts.config, out_dir=str(work),
               peers=list(opts.peers), gate=opts.timing)


def _run_cases(path: Path, cases: list[Case], device: str, opts: BenchOptions, rows: list[CaseResult],
               child: Optional[Child] = None,
               done: Optional[Callable[[Case, CaseResult], None]] = None) -> int:
    """Children evaluate the cases (`child`, started early, for all unless one dies); each case's outputs are
    verified here as soon as the child has finished it, while the child waits before its next timing (so no
    check runs beside a timed call), then `done(case, row)`. Returns how many cases ran: fewer than all when
    opts.deadline stopped the run (the rows of the others are not filled)."""
    import threading

    jobs = [_make_job(path, c, device, opts, r) for c, r in zip(cases, rows)]
    preload = threading.Thread(target=_preload, args=(device,), daemon=True)

    def settle(i: int, oc: Outcome) -> None:
        case, r, job = cases[i], rows[i], jobs[i]
        t0 = time.perf_counter()
        r.overhead_s["child_wall"] = round(oc.wall_s, 3)
        if child is not None and child.kept and i == 0:
            r.overhead_s["child_kept"] = 1  # started by the previous run's supervisor: no start-up in this run
        _fill_from_child(r, oc, device)
        if oc.result and oc.failure() is None:
            preload.join()  # the imports the check needs
            _verify_outputs(r, case, device, Path(job.out_dir), oc.result.outputs, opts.baseline)
            if job.peers:  # each peer's output checked too; the best correct one sets REF and SPEEDUP
                from kopt.eval.peers import settle as settle_peers

                settle_peers(r, case, device, Path(job.out_dir))
        _derive(r, case, device)
        r.overhead_s["verify"] = round(time.perf_counter() - t0, 3)
        shutil.rmtree(job.out_dir, ignore_errors=True)  # a long run keeps no case's saved outputs after it
        if done:
            done(case, r)

    try:
        outcomes = run_jobs(jobs, opts.timeout_s, opts.progress, child=child, on_outcome=settle,
                            on_start=preload.start, ready=lambda: not preload.is_alive(), deadline=opts.deadline)
    finally:
        for job in jobs:
            shutil.rmtree(job.out_dir, ignore_errors=True)
    return sum(oc is not None for oc in outcomes)


def _check_hidden(path: Path, case: Case, device: str, opts: BenchOptions, r: CaseResult) -> None:
    """Correctness (untimed) on the hidden variant; a candidate special-casing the table shapes fails here."""
    from dataclasses import replace

    hc = hidden_variant(case)
    h = CaseResult(row_id=r.row_id, case=case.id, variant=hc.variant.label())
    _run_cases(path, [hc], device, replace(opts, timing=False, deadline=None), [h])  # its own child
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
        r.take_timings(res.timing, res.ref_timing)
        r.ref, r.speedup_ci, r.peers = res.ref_name, res.speedup_ci, res.peers
        r.overhead_s.update({k: round(v, 3) for k, v in res.overhead_s.items()})
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


def _verify_outputs(r: CaseResult, case: Case, device: str, work: Path, outputs, prefer: str) -> None:
    """Check every saved output against the fp32 reference of the same seed (kopt.eval.checks.check_outputs)."""
    from kopt import baselines
    from kopt.eval import checks

    base = baselines.tolerance_baseline(case, device, prefer)
    if r.ref == "NA":  # untimed runs: the baseline still ran, to set the tolerance
        r.ref = base.name
    status, r.validation, base_failed = checks.check_outputs(case, device, base, outputs, work)
    for name in base_failed:
        r.message = (r.message + f"; tolerance baseline {base.name} failed ({name}),"
                     " used the reference rounded to the dtype").strip("; ")
    if status != Status.ok:
        r.status, r.message = status, r.validation.detail
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()  # check_outputs' workloads are gone with its frame


def _derive(r: CaseResult, case: Case, device: str) -> None:
    """Correct flag, bandwidth, % of the read ceiling and of the limit, the implausibility guard, improvement."""
    from kopt import roofline
    from kopt.eval import checks, noise
    from kopt.store import calibration
    from kopt.timing import stats
    from kopt.workload import bytes_moved, gbps

    r.correct = r.status in (Status.ok, Status.baseline_error) and r.compiled
    if r.runtime_ms:
        r.gbps = gbps(case, r.runtime_ms)
        roof = roofline.for_device(device) if device == "cuda" else None
        if roof:
            r.pct_peak = 100.0 * r.gbps / roof.read_gbps
            r.limit_ms = roofline.limit_ms(bytes_moved(case), roof)
            r.pct_limit = roofline.pct_limit(r.limit_ms, r.runtime_ms)
            if r.correct and r.timing and r.timing.cold and checks.implausible(r.gbps, roof.read_gbps):
                r.status, r.correct = Status.implausible, False
                r.message = checks.implausible_message(r.gbps, roof.read_gbps, "measured read ceiling")
    r.noisy = noise.row_noisy(r.speedup, r.speedup_ci, r.runtime_ms, r.ref_runtime_ms,
                              r.timing.noisy if r.timing else None)
    # beats the reference beyond the noise; a one-off --config run is no candidate, so it gets no such flag
    if r.correct and r.speedup is not None and r.speedup_ci is not None and not r.config:
        r.improvement = stats.is_improvement(r.speedup, r.speedup_ci, calibration.aa_spread(r.device))
