"""The Verdict: every named perf case timed cold, a correctness matrix with fresh seeds, hidden variants, and
held-out shapes drawn from the workload library and timed like the perf cases.

Aggregates per group: GEOMEAN_SPEEDUP over the uniform perf cases (every sequence at full length, the
seed's cases), GEOMEAN_SPEEDUP_RAGGED over the ragged ones, GEOMEAN_SPEEDUP_SEED over the seed projects'
model shapes, and GEOMEAN_SPEEDUP_HELDOUT over the held-out draws (the number to move: the named cases are
a sample), each with its PCT_LIMIT geomean. They are kept apart so a gain on one kind cannot hide a loss
on another (kopt.policy.iterations' rule reads them). The held-out geomeans are over the draws that ran
correctly, beside HELDOUT_CORRECT (k/n): a draw is random, so one failure must not hide the other eleven;
any failed row still fails the verdict, and FAILED names it.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

from kopt.cases import TIMED_KINDS, Case, CaseFile, reshaped
from kopt.eval.bench import BenchOptions, evaluate, warm_hints
from kopt.eval.child import Child
from kopt.records import CaseResult, Status, fmt_na
from kopt.timing.stats import geomean

#: Kinds of named case the Verdict times by default: uniform perf cases, ragged batches, seed shapes.
PERF_KINDS = TIMED_KINDS


@dataclass
class Verdict:
    """All rows of one verdict and the aggregate."""

    perf: list[CaseResult]
    matrix: list[CaseResult]
    hidden: list[CaseResult]
    heldout: list[CaseResult] = field(default_factory=list)
    heldout_seed: Optional[int] = None
    vs_best: Optional[float] = None
    """Geomean over the held-out draws of this candidate's SPEEDUP / the reigning candidate's on the same draw
    (kopt.policy.ranking.heldout_ratio); None when the reigning candidate was not timed."""
    best_id: Optional[str] = None
    """The reigning candidate timed on the same draws."""
    planned: dict[str, int] = field(default_factory=dict)
    """Rows each group (perf, matrix, hidden, heldout) planned; fewer ran when --budget stopped the run."""
    screen: bool = False
    """A quick verdict (`kopt verify --quick`, kopt.eval.verdict.quick_plan): a screen, not a verdict."""

    @property
    def not_run(self) -> dict[str, int]:
        """Rows per group that a budget left out (empty when the run finished)."""
        have = {"perf": len(self.perf), "matrix": len(self.matrix), "hidden": len(self.hidden),
                "heldout": len(self.heldout)}
        return {g: n - have[g] for g, n in self.planned.items() if n > have[g]}

    @property
    def stopped(self) -> bool:
        """The budget stopped the run before every planned row ran: no verdict."""
        return bool(self.not_run)

    @property
    def rows(self) -> list[CaseResult]:
        """Every row, perf first."""
        return self.perf + self.matrix + self.hidden + self.heldout

    @property
    def uniform(self) -> list[CaseResult]:
        """The timed rows of uniform cases (every sequence at full length): GEOMEAN_SPEEDUP's set."""
        return [r for r in self.perf if r.case_kind in (None, "edge", "perf")]

    @property
    def seed(self) -> list[CaseResult]:
        """The timed rows of the seed projects' model shapes: GEOMEAN_SPEEDUP_SEED's set."""
        return [r for r in self.perf if r.case_kind == "seed"]

    @property
    def ragged(self) -> list[CaseResult]:
        """The timed rows of ragged cases: GEOMEAN_SPEEDUP_RAGGED's set."""
        return [r for r in self.perf if r.case_kind == "ragged"]

    @property
    def geomean(self) -> Optional[float]:
        """Geometric-mean SPEEDUP over the uniform perf cases (NA if any is missing)."""
        return _all_or_none(self.uniform, "speedup")

    @property
    def geomean_ragged(self) -> Optional[float]:
        """Geometric-mean SPEEDUP over the ragged perf cases (NA if any is missing or none was timed)."""
        return _all_or_none(self.ragged, "speedup")

    @property
    def geomean_pct_limit(self) -> Optional[float]:
        """Geometric mean of PCT_LIMIT over the uniform perf cases (NA if any is missing)."""
        return _all_or_none(self.uniform, "pct_limit")

    @property
    def geomean_pct_limit_ragged(self) -> Optional[float]:
        """Geometric mean of PCT_LIMIT over the ragged perf cases (NA if any is missing)."""
        return _all_or_none(self.ragged, "pct_limit")

    @property
    def min_speedup(self) -> Optional[float]:
        """The slowest perf case's SPEEDUP."""
        sp = [r.speedup for r in self.perf if r.speedup]
        return min(sp) if sp else None

    @property
    def geomean_seed(self) -> Optional[float]:
        """Geometric-mean SPEEDUP over the seed cases (NA if any is missing or none was timed)."""
        return _all_or_none(self.seed, "speedup")

    @property
    def geomean_pct_limit_seed(self) -> Optional[float]:
        """Geometric mean of PCT_LIMIT over the seed cases (NA if any is missing)."""
        return _all_or_none(self.seed, "pct_limit")

    @property
    def geomean_heldout(self) -> Optional[float]:
        """Geometric-mean SPEEDUP over the held-out draws that ran correctly (module docstring)."""
        return geomean([r.speedup for r in self.heldout if r.correct and r.speedup])

    @property
    def geomean_pct_limit_heldout(self) -> Optional[float]:
        """Geometric mean of PCT_LIMIT over the held-out draws that ran correctly."""
        return geomean([r.pct_limit for r in self.heldout if r.correct and r.pct_limit])

    @property
    def min_speedup_heldout(self) -> Optional[float]:
        """The slowest held-out draw's SPEEDUP."""
        sp = [r.speedup for r in self.heldout if r.correct and r.speedup]
        return min(sp) if sp else None

    @property
    def failed_rows(self) -> list[CaseResult]:
        """Rows that did not compile or were not correct (each fails the verdict)."""
        return [r for r in self.rows if not (r.compiled and r.correct)]

    @property
    def passed(self) -> bool:
        """Every row compiled and correct."""
        return bool(self.rows) and all(r.compiled and r.correct for r in self.rows)

    @property
    def outcome(self) -> str:
        """VERDICT's value: fail (a row failed), stopped (the budget left rows out), screen (a quick verdict that
        passed: not a verdict) or pass."""
        if self.failed_rows:
            return "fail"
        if self.stopped:
            return "stopped"
        if not self.rows:
            return "fail"
        return "screen" if self.screen else "pass"

    def line(self) -> str:
        """The aggregate machine line."""
        n_ok = sum(r.correct for r in self.rows)
        x = lambda v: fmt_na(v, "{:.4f}x")  # noqa: E731
        pct = lambda v: fmt_na(v, "{:.1f}")  # noqa: E731
        not_run = ",".join(f"{g}={n}" for g, n in self.not_run.items()) or "NA"
        # The first fields keep their order and names (agents parse them); new ones only follow. CORRECT is a
        # bool as on every line; the count of correct rows is ROWS_CORRECT.
        return (f"VERDICT:{self.outcome} GEOMEAN_SPEEDUP:{x(self.geomean)} "
                f"MIN_SPEEDUP:{x(self.min_speedup)} CORRECT:{self.passed} ROWS_CORRECT:{n_ok}/{len(self.rows)} "
                f"PERF_CASES:{len(self.perf)} MATRIX:{len(self.matrix)} HIDDEN:{len(self.hidden)} "
                f"GEOMEAN_SPEEDUP_RAGGED:{x(self.geomean_ragged)} GEOMEAN_PCT_LIMIT:{pct(self.geomean_pct_limit)} "
                f"GEOMEAN_PCT_LIMIT_RAGGED:{pct(self.geomean_pct_limit_ragged)} "
                f"GEOMEAN_SPEEDUP_SEED:{x(self.geomean_seed)} "
                f"GEOMEAN_PCT_LIMIT_SEED:{pct(self.geomean_pct_limit_seed)} "
                f"HELDOUT:{len(self.heldout)} HELDOUT_SEED:{fmt_na(self.heldout_seed, '{}')} "
                f"HELDOUT_CORRECT:{sum(r.correct for r in self.heldout)}/{len(self.heldout)} "
                f"GEOMEAN_SPEEDUP_HELDOUT:{x(self.geomean_heldout)} "
                f"GEOMEAN_PCT_LIMIT_HELDOUT:{pct(self.geomean_pct_limit_heldout)} "
                f"MIN_SPEEDUP_HELDOUT:{x(self.min_speedup_heldout)} HELDOUT_VS_BEST:{x(self.vs_best)} "
                f"BEST:{self.best_id or 'NA'} FAILED:{failed_names(self.failed_rows)} NOT_RUN:{not_run}")


def failed_names(rows: list[CaseResult]) -> str:
    """The failed rows as one token: `case/variant-or-model=status`, comma-joined (NA when none failed)."""
    if not rows:
        return "NA"
    names = [f"{r.case}/{r.model or r.variant}={r.status.value}" for r in rows]
    return ",".join(n.replace(" ", "_").replace(":", "_") for n in names)


def _all_or_none(rows: list[CaseResult], attr: str) -> Optional[float]:
    """Geomean of one positive field over correct rows; None unless every row has it (a partial geomean
    would flatter a candidate that failed or was not timed on some case)."""
    vals = [getattr(r, attr) for r in rows if r.correct and getattr(r, attr)]
    return geomean(vals) if vals and len(vals) == len(rows) else None


def hidden_cases(perf: list[Case], n: int, rng: random.Random) -> list[Case]:
    """Shapes the candidate has not seen: another batch, a perturbed seqlen, seeded ragged lengths, either
    dtype (a ragged source case loses its own lengths: kopt.eval.bench.reshaped)."""
    out = []
    for c in rng.sample(perf, min(n, len(perf))):
        s = max(1, c.seqlen_k + rng.randint(-max(1, c.seqlen_k // 8), max(1, c.seqlen_k // 8)))
        h = reshaped(c, c.batch + rng.randint(1, 3), s)
        out.append(h.with_variant(seqlens="ragged", dtype=rng.choice(["fp16", "bf16"])))
    return out


def heldout_draw(n: int, seed: int, device: str) -> list[Case]:
    """The verdict's held-out cases: n draws of the workload library from `seed` (cut to CPU size on a CPU)."""
    from kopt import workloads

    return workloads.draw(workloads.load(), n, seed, cpu=device == "cpu") if n else []


#: The quick verdict (`kopt verify --quick`), a screen: the largest cache (bytes of K and V as allocated) of a
#: row it runs, per device kind (None: no cap); the matrix's fresh seeds, hidden shapes and held-out draws it
#: runs. On the 2-core CPU the named cases above the cap cost minutes each (the torch reference alone reads
#: 0.2-0.4 s per 16 MiB of cache under load), so the screen leaves them out and says so.
QUICK_MAX_CACHE = {"cpu": 32 << 20, "cuda": None}
QUICK_SEEDS, QUICK_HIDDEN, QUICK_HELDOUT = 1, 2, 4


def cache_bytes(case: Case) -> int:
    """K and V of a case as allocated: batch x capacity x KV heads x head dim, two 2-byte tensors."""
    return 2 * 2 * case.batch * case.capacity * case.kv_heads * case.variant.head_dim


def quick_fits(case: Case, device: str) -> bool:
    """Whether the quick verdict runs this case on this device (QUICK_MAX_CACHE)."""
    cap = QUICK_MAX_CACHE.get("cpu" if device == "cpu" else "cuda")
    return cap is None or cache_bytes(case) <= cap


def matrix_cases(cf: CaseFile) -> list[Case]:
    """The verify matrix of a case file expanded: each entry's cases in its variant, in the file's order."""
    by_id = {c.id: c for c in cf.cases}
    return [by_id[i].with_variant(dtype=m.dtype, head_dim=m.head_dim, page_size=m.page_size, seqlens=m.seqlens)
            for m in cf.verify.matrix for i in m.cases]


def plan(cf: CaseFile, opts: BenchOptions, perf_ids: Optional[list[int]] = None,
         heldout: Optional[list[Case]] = None, quick: bool = False) -> list[list[tuple[Case, BenchOptions]]]:
    """The Verdict's four groups (perf, matrix, hidden, held-out) as (case, options) pairs, all under one run_id.
    quick: the screen (rows of mode `screen`): named cases and matrix rows within QUICK_MAX_CACHE on this
    device (every case given with --case is timed), QUICK_SEEDS per matrix row, QUICK_HIDDEN hidden shapes."""
    import uuid

    from kopt.hardware import resolve_device

    device = resolve_device(opts.device)
    fits = (lambda c: quick_fits(c, device)) if quick else (lambda c: True)  # noqa: E731
    by_id = {c.id: c for c in cf.cases}
    perf = [by_id[i] for i in perf_ids] if perf_ids else [c for c in cf.cases if c.kind in PERF_KINDS and fits(c)]
    in_matrix = [c for c in matrix_cases(cf) if fits(c)]
    rng = random.Random()  # unseeded on purpose: hidden shapes differ at every verdict
    n_hidden = min(QUICK_HIDDEN, cf.verify.hidden) if quick else cf.verify.hidden
    hidden_shapes = [h for h in hidden_cases(perf, n_hidden, rng) if fits(h)]
    heldout = heldout or []
    # every row says how many the run writes, so a run stopped before its end is seen as one
    n = len(perf) + len(in_matrix) + len(hidden_shapes) + len(heldout)
    base = replace(opts, mode="screen" if quick else "verdict", run_id=opts.run_id or uuid.uuid4().hex[:12],
                   verdict_rows=n or None, kept_child=False, quick=opts.quick or quick)
    check = replace(base, timing=False, seeds=QUICK_SEEDS if quick else max(cf.verify.seeds, 1))
    matrix = replace(check, tag="matrix")
    hidden = replace(check, tag="hidden-b{batch}-s{seqlen_k}")  # one options object: one child for all
    return [[(c, base) for c in perf], [(c, matrix) for c in in_matrix], [(h, hidden) for h in hidden_shapes],
            [(c, base) for c in heldout]]


def left_out(cf: CaseFile, device: str, perf_ids: Optional[list[int]] = None) -> dict[str, list[str]]:
    """What the quick verdict leaves out on this device, per group: `case/variant` names (QUICK_MAX_CACHE)."""
    perf = [] if perf_ids else [f"{c.id}/{c.variant.label()}" for c in cf.cases
                                if c.kind in PERF_KINDS and not quick_fits(c, device)]
    matrix = [f"{c.id}/{c.variant.label()}" for c in matrix_cases(cf) if not quick_fits(c, device)]
    return {k: v for k, v in (("perf", perf), ("matrix", matrix)) if v}


def run(path: Path, cf: CaseFile, opts: BenchOptions, perf_ids: Optional[list[int]] = None,
        on_result: Optional[Callable[[CaseResult], None]] = None, heldout: Optional[list[Case]] = None,
        quick: bool = False) -> Verdict:
    """Run the whole Verdict (quick: the screen); every row goes to the ledger with mode=verdict (screen). A
    budget (opts.deadline) stops it between rows: the groups' planned counts say what did not run."""
    from itertools import groupby

    rows: list[list[CaseResult]] = []
    groups = plan(cf, opts, perf_ids, heldout, quick)
    # Consecutive cases with the same options share one evaluation (one child process).
    batches = [[(o, [c for c, _ in items]) for o, items in groupby(group, key=lambda it: it[1])] for group in groups]
    cuda = opts.device.startswith("cuda")
    # On CUDA every evaluation's child starts before the compiles, so that its start-up (the interpreter, torch,
    # a CUDA context, tilelang: 3 s each on an H100 host) overlaps them instead of coming between the groups. On
    # the CPU each starts when its evaluation does: one warming up would share the host clock with timed rows.
    hints = warm_hints(path, opts.device) if cuda else ()
    children = [Child(warm=hints) for b in batches for _ in b] if cuda else []
    try:
        if cuda:
            from kopt.eval.prewarm import warm_each

            warm_each([(Path(path), opts.config)], [c for group in groups for c, _ in group], "verify")
        for b in batches:
            out: list[CaseResult] = []
            for o, cases in b:
                out += evaluate(path, cases, o, on_result, child=children.pop(0) if children else None)
            rows.append(out)
    finally:
        for c in children:  # the evaluations a stop (an error, Ctrl-C) left unstarted
            c.close()
    return Verdict(*rows, heldout_seed=opts.heldout_seed, planned=planned(groups), screen=quick)


def planned(groups: list[list]) -> dict[str, int]:
    """Rows per group of a plan, by name."""
    return dict(zip(("perf", "matrix", "hidden", "heldout"), map(len, groups)))


# ---------------------------------------------------------------- the Verdict on an executor (kopt.executor)

def verify_row(path: str, item):
    """Shard function of a spread Verdict: one row through kopt.eval.bench.evaluate, left unrecorded (the head
    appends it), naming the host and unit count of the machine that measured it."""
    from kopt.hardware import detect, resolve_device

    case, opts = item
    r = evaluate(Path(path), [case], replace(opts, record=False, kept_child=False))[0]
    r.host = socket.gethostname()
    r.units = int(detect(resolve_device(opts.device)).units or 0)
    return r


def run_spread(path, cf, opts, perf_ids, on_result, ex, heldout=None):
    """`run` with every row (perf, matrix, hidden) a shard of the executor `ex`: same rows, same order;
    this process appends each row to the ledger as it arrives (one writer)."""
    import uuid

    from kopt import candidate, paths
    from kopt.eval.bench import row_label
    from kopt.executor import PoolResult
    from kopt.store import ledger

    groups = plan(cf, opts, perf_ids, heldout)
    items = [it for g in groups for it in g]  # the executors' path: no budget, no screen
    led = paths.ledger_file()
    if opts.record:
        ledger.check_writable(led)
    chash = candidate.content_hash(Path(path))
    rows: dict[int, CaseResult] = {}

    def row(r: PoolResult) -> CaseResult:
        if r.index in rows:
            return rows[r.index]
        case, o = items[r.index]
        if r.error is None:
            rows[r.index] = row_ = r.value
            if r.retried:
                row_.message = "; ".join(x for x in (row_.message, f"retried after: {r.retried}") if x)[:500]
        else:
            rows[r.index] = row_ = CaseResult(
                row_id=uuid.uuid4().hex[:16], run_id=o.run_id, mode="verdict", candidate_path=paths.recorded(path),
                candidate_hash=chash, candidate_id=candidate.short_id(chash), case=case.id, case_kind=case.kind,
                variant=row_label(case, o.tag), model=case.model,
                shape=case.shape_label() if case.model else None,
                heldout_seed=o.heldout_seed if case.kind == "heldout" else None,
                status=Status.crash, message=f"{ex.label}: {r.error.splitlines()[0]}"[:500], host=r.host)
        return row_

    def arrived(r: PoolResult) -> None:
        if opts.record:
            ledger.append(led, [row(r)])
        if on_result:
            on_result(row(r))

    out = [row(r) for r in ex.run(verify_row, Path(path), items, arrived)]
    cut = [0]
    for g in groups:
        cut.append(cut[-1] + len(g))
    return Verdict(*(out[a:b] for a, b in zip(cut, cut[1:])), heldout_seed=opts.heldout_seed, planned=planned(groups))


def run_on(path, cf, opts, perf_ids, on_result, ex, heldout=None, quick: bool = False):
    """The Verdict on an executor (kopt.executor): `run` in this host's order when it runs serially, else spread
    (the quick verdict and --budget run serially only)."""
    opts = replace(opts, device=ex.device)   # what the executor reserved (a GPU per task, or a CPU)
    if not ex.parallel or quick or opts.deadline is not None:
        return run(path, cf, opts, perf_ids, on_result, heldout, quick)
    return run_spread(path, cf, opts, perf_ids, on_result, ex, heldout)


def run_on_gpus(path, cf, opts, perf_ids, on_result, gpus, heldout=None):
    """`run` with every row (perf, matrix, hidden, held-out) spread over these GPUs of this host; same rows,
    same order."""
    from kopt.executor.base import LocalExecutor
    from kopt.hardware import resolve_device

    return run_spread(path, cf, opts, perf_ids, on_result, LocalExecutor(gpus, resolve_device(opts.device)),
                      heldout)


def time_reigning(reigning: Path, cases: list[Case], opts: BenchOptions, run_id: str,
                  on_result: Optional[Callable[[CaseResult], None]] = None) -> list[CaseResult]:
    """The reigning candidate timed on a verdict's held-out cases (mode=heldout, paired_run=the verdict's run):
    the improvement rule compares the two on the same draws (kopt.policy.iterations: overfit)."""
    o = replace(opts, mode="heldout", run_id=None, verdict_rows=None, kept_child=False, paired_run=run_id,
                parent_id=None, technique=None, hypothesis=None)
    return evaluate(reigning, cases, o, on_result)
