"""`kopt peers`: the candidate against every available peer kernel, side by side, in one evaluation.

One evaluation child per run (kopt.eval.bench.evaluate_peers, BenchOptions.peers): it checks the candidate
once, then times it against each peer in turn with ABBA rounds (kopt.timing.time_pair, cold, device
spans as every bench), and saves each peer's output on the timed inputs. The parent checks those
outputs against the fp32 reference (a wrong peer is reported, never the best peer); the best correct
peer of a case sets its row's REF / SPEEDUP. Rows go to the ledger with mode=peers; the panel
(kopt.report.panel) is rendered and written from them. This module holds the child's half (time_peers)
and the parent's (settle).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kopt.cases import Case
from kopt.records import CaseResult, PeerResult, Status


def output_file(peer: str) -> str:
    """Name of the file the child saves a peer's output on the first timed input set to."""
    return f"peer-{peer}.pt"


def check_names(names: list[str]) -> list[str]:
    """Named peers in panel order, then candidate files (`*.py`, `REV:PATH.py`, a commit's candidate, or a `.patch`
    over the shipped candidate; as absolute paths); an unknown name, a file that is not there, a revision without the
    file or a patch that does not apply is a usage error."""
    from kopt.baselines import PEERS, is_candidate_file
    from kopt.candidate import is_revision
    from kopt.errors import UsageError
    from kopt.store import resolve_candidate

    files = [n for n in names if is_candidate_file(n)]
    missing = [f for f in files if not is_revision(f) and not Path(f).is_file()]
    if missing:
        raise UsageError(f"peer candidate file {missing[0]} not found")
    bad = [n for n in names if n not in PEERS and n not in files]
    if bad or not names:
        raise UsageError(f"unknown peer {bad[0] if bad else '(none)'!r}; use some of {', '.join(PEERS)}, or a "
                         "candidate file (a .py path, REV:PATH.py at a commit, or a .patch over the shipped one)")
    return [p for p in PEERS if p in names] + list(dict.fromkeys(str(resolve_candidate(f)) for f in files))


# ---------------------------------------------------------------- in the evaluation child

def time_peers(res, cand: Callable[[], object], timed: list, job, opts) -> None:
    """Time the candidate against each peer of the job (ABBA); fill res.peers and, provisionally, the
    row's figures from the fastest peer (the parent re-picks it among the peers that were correct)."""
    from kopt import baselines
    from kopt.timing import time_fn, time_pair

    for spec in job.peers:
        base = baselines.pick(job.case, job.device, spec)
        name = baselines.peer_name(spec)
        p = PeerResult(peer=name, ref=base.name, na=base.na)
        res.peers.append(p)
        if base.na:
            continue
        try:
            fn = _first_call(name, base, timed, job)
        except Exception as e:  # a library that rejects the shape at run time: NA with its words
            p.na = f"failed: {type(e).__name__}: {str(e)[:200]}"
            continue
        try:  # the candidate's own failures propagate from here as in any bench
            pair = time_pair(cand, fn, job.device, opts)
        except _PeerFailed as e:
            p.na = f"failed while timed: {e}"
            continue
        p.timing, p.ref_timing, p.speedup, p.speedup_ci = pair.a, pair.b, pair.speedup, pair.ci
    ran = [p for p in res.peers if p.na is None]
    if not ran:
        res.baseline_failed = True
        res.message = "no peer ran: " + "; ".join(f"{p.peer}: {p.na}" for p in res.peers)
        res.timing = time_fn(cand, job.device, opts)
        return
    _adopt(res, min(baselines.named_first(ran), key=lambda p: p.ref_timing.median_ms))


class _PeerFailed(Exception):
    """A peer's timed call raised (told apart from the candidate's failures, which end the job)."""


def _first_call(name: str, base, timed: list, job) -> Callable[[], object]:
    """The peer's first call (a library's JIT or set-up, outside the timed rounds), its output saved for
    the parent's check; then its timed calls over the rotated inputs, each prepared once."""
    import torch

    from kopt.integrity import guards
    from kopt.timing import Rotation

    calls = [base.bind(w) for w in timed]  # each input set prepared once (re-paging, planning)
    first = calls[0]()
    guards.sync(job.device)
    torch.save(first.detach().cpu(), Path(job.out_dir) / output_file(name))

    def guarded(c):
        def call():
            try:
                return c()
            except Exception as e:
                raise _PeerFailed(f"{type(e).__name__}: {str(e)[:200]}") from None
        return call

    return Rotation([guarded(c) for c in calls])  # each input set captured on its own


def _adopt(row, p: PeerResult) -> None:
    """Give a row (WorkerResult or CaseResult) the figures of its pairing with peer p."""
    row.speedup, row.speedup_ci = p.speedup, p.speedup_ci
    if isinstance(row, CaseResult):
        row.take_timings(p.timing, p.ref_timing)
        row.ref = p.ref
    else:
        row.timing, row.ref_timing, row.ref_name = p.timing, p.ref_timing, p.ref


# ---------------------------------------------------------------- in the parent

def settle(r: CaseResult, case: Case, device: str, work: Path) -> None:
    """Check each peer's saved output against the fp32 reference (tolerance from the default baseline,
    as for the candidate); the fastest correct peer sets the row's REF, RUNTIME pair and SPEEDUP."""
    import torch

    from kopt import baselines
    from kopt.eval import checks
    from kopt.eval.jobs import SavedOutput

    ran = [p for p in r.peers if p.na is None]
    saved = [p for p in ran if (work / output_file(p.peer)).is_file()]
    for p in ran:
        if p not in saved:
            p.correct, p.message = False, "no output was saved"
    if saved and r.seed is not None:
        outs = [SavedOutput(file=output_file(p.peer), seed=r.seed, kind="peer") for p in saved]
        found, _ = checks.check_saved(case, device, baselines.tolerance_baseline(case, device), outs,
                                      lambda so: torch.load(work / so.file, weights_only=True))
        for p, c in zip(saved, found):
            p.correct = c.status == Status.ok
            p.message = "" if p.correct else f"{c.status.value}: {c.detail}"
    good = [p for p in ran if p.correct and p.timing and p.ref_timing]
    if good:
        _adopt(r, min(baselines.named_first(good), key=lambda p: p.ref_timing.median_ms))
        return
    r.ref, r.ref_runtime_ms, r.ref_eager_ms, r.ref_timing, r.speedup, r.speedup_ci = "NA", None, None, None, None, None
    if r.status == Status.ok:
        r.status = Status.baseline_error  # the candidate ran; there is no peer to compare it with
        r.message = "no peer ran correctly: " + "; ".join(
            f"{p.peer}: {p.na or p.message}" for p in r.peers)[:480]
