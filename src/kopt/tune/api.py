"""Tuning: per case, try the candidate's configs in isolated children and keep the fastest correct one.

A case's config list (`configs(case)`, first entry = the heuristic default) is cut to
--max-configs (the default plus K-1 spread evenly), split into shards when there are more GPUs
(of this host, or of a Ray cluster: kopt.executor) than cases (every shard re-times the default, so
gains are always measured in one process on one GPU), and each shard runs in one `kopt.tune.worker`
child. The calling process alone writes the table and the ledger, wherever the shards ran.
Optional prewarm children compile the shard's configs in parallel first (TileLang's disk cache is
process-safe), so the timing child mostly loads kernels. A child that dies blames the config in
progress and a fresh child takes the rest.

The search has two stages. The screen compiles, checks and times every config cold with the quick
timing options; then the --finalists fastest (default excluded) are timed against their shard's
default in interleaved ABBA rounds (full options unless --quick). Outputs are checked here against
the fp32 reference; the winner is the correct finalist with the highest paired speedup that passes
the improvement rule (CI above 1, effect >= max(1%, 3 x the device's A/A spread)); when none
passes, the default stays (gain 1). Results without paired figures fall back to the screened
medians (kopt.tune.pick). Winners are upserted into results/<backend>/tuning.csv (kopt.store.tuning).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Optional

from kopt import proc
from kopt.candidate import short_id
from kopt.cases import Case
from kopt.records import Status, fmt_na
from kopt.tune.models import ConfigResult, ShardResult
from kopt.tune.pick import best_finalist, pick_winner
from kopt.tune.shard import ShardItem, run_shard


@dataclass
class TuneOptions:
    """Everything a tuning run needs besides the candidate and the cases."""

    device: str = "auto"
    gpus: Optional[str] = None
    """--gpus N | all; None: this process's device only."""
    executor: str = "local"
    """local: this host (gpus above); ray: one Ray task per shard on a cluster (kopt.executor.ray)."""
    ray_address: Optional[str] = None
    """The cluster to join (`ray start --head` prints it); None: $RAY_ADDRESS or the one started on this host."""
    ray_shared: bool = False
    """Every node sees the workspace at the same path: ship only kopt, not the workspace."""
    max_configs: Optional[int] = None
    quick: bool = False
    hot: bool = True
    timeout_s: float = 600.0
    """Wall-clock limit per tuning child (one shard)."""
    baseline: str = "auto"
    csv: Optional[Path] = None
    """Tuning table; default <workspace>/results/<backend>/tuning.csv."""
    write: bool = True
    record: bool = True
    """Append one mode=tune ledger row per case (the winner)."""
    ledger: Optional[Path] = None
    compile_jobs: Optional[int] = None
    """Parallel prewarm children per shard; None: auto (CUDA only), 0/1: none."""
    configs: Optional[list[dict]] = None
    """--config: search these beside the candidate's default instead of configs(case)."""
    heldout_seed: Optional[int] = None
    """The seed of the held-out draws among the cases (kept on their ledger rows)."""
    max_reruns: int = 3
    keep_dir: Optional[Path] = None
    finalists: int = 3
    """Screened configs (besides the default) paired against the default; 0: pick by screened medians."""
    deadline: Optional[float] = None
    """A time.time() (`--budget`): no case starts after it and a case it cuts is not run (not in the results)."""


@dataclass
class CaseTune:
    """The outcome of tuning one case."""

    case: Case
    shards: list[ShardResult] = field(default_factory=list)
    configs: list[ConfigResult] = field(default_factory=list)
    winner: Optional[ConfigResult] = None
    default: Optional[ConfigResult] = None
    gain: Optional[float] = None
    note: str = ""
    wall_s: float = 0.0
    row: Optional[object] = None
    csv: Optional[Path] = None

    @property
    def meta(self) -> ShardResult:
        """The first shard's report (device, backend, config count)."""
        return self.shards[0] if self.shards else ShardResult()

    @property
    def ok(self) -> bool:
        """A correct winner was found."""
        return self.winner is not None

    @property
    def not_applicable(self) -> str:
        """Why there was nothing to tune (every config runs one plan on this device); "" when the search ran."""
        return next((s.not_applicable for s in self.shards if s.not_applicable), "")

    @property
    def status(self) -> str:
        """ok (a correct winner), not_applicable (nothing to tune here) or failed."""
        return "ok" if self.ok else "not_applicable" if self.not_applicable else "failed"

    @property
    def gain_ci(self) -> Optional[tuple[float, float]]:
        """The paired gain's CI; None when the gain is not a paired figure (the default kept, or the
        unpaired fallback picked the winner)."""
        w = self.winner
        if w is None or w is self.default or not w.paired_ci or self.gain != w.paired_speedup:
            return None
        return w.paired_ci

    @property
    def finalist(self) -> Optional[ConfigResult]:
        """The best paired finalist (pick.best_finalist): the winner when a finalist won; otherwise what the default
        kept its place against. None when no finalist was paired."""
        return best_finalist(self.configs)

    def times_ms(self) -> tuple[Optional[float], Optional[float]]:
        """(default, winner) cold medians: from the winner's paired rounds when its gain is the paired
        figure (gain_ci), else screened."""
        w, d = self.winner, self.default
        if self.gain_ci is not None and w.paired_a and w.paired_b:
            return w.paired_b.median_ms, w.paired_a.median_ms
        ms = lambda c: None if c is None or c.cold is None else c.cold.median_ms  # noqa: E731
        return ms(d), ms(w)

    def line(self) -> str:
        """One stdout line per case, KEY:VALUE fields like the machine line: TUNE's value is STATUS's; CORRECT a bool
        (a correct winner), the count of correct configs in CONFIGS_CORRECT; CONFIG the winner as key=value pairs
        (the JSON object in --json); FINALIST, FINALIST_GAIN and FINALIST_CI the best paired finalist, its paired
        speedup over the default and that speedup's CI, also where it did not pass the improvement rule and the
        default was kept (NA when no finalist was paired)."""
        from kopt.records import config_token, token

        m, w = self.meta, self.winner
        d_ms, w_ms = self.times_ms()
        n_ok = sum(bool(c.correct) for c in self.configs)
        ci = "NA" if self.gain_ci is None else f"{self.gain_ci[0]:.4f}-{self.gain_ci[1]:.4f}"
        f = self.finalist
        fin = (f"FINALIST:{config_token(f.config)} FINALIST_GAIN:{f.paired_speedup:.4f}x "
               f"FINALIST_CI:{f.paired_ci[0]:.4f}-{f.paired_ci[1]:.4f}" if f is not None else
               "FINALIST:NA FINALIST_GAIN:NA FINALIST_CI:NA")
        why = self.not_applicable or ("" if w else (m.message or _first_failure(self.configs)))
        msg = f" MESSAGE:{token(why)[:200]}" if why else ""
        return (f"TUNE:{self.status} CASE:{self.case.id} DEVICE:{token(m.device_name)} "
                f"CONFIGS:{len(self.configs)}/{m.n_configs} CORRECT:{w is not None} CONFIGS_CORRECT:{n_ok} "
                f"DEFAULT:{fmt_na(d_ms)} BEST:{fmt_na(w_ms)} GAIN:{fmt_na(self.gain, '{:.4f}x')} GAIN_CI:{ci} "
                f"CONFIG:{config_token(w.config) if w else 'NA'} {fin} TIME:{self.wall_s:.1f}s STATUS:{self.status}"
                f"{msg}")


def _json(v) -> str:
    import json

    return json.dumps(v, sort_keys=True, separators=(",", ":"))


def _first_failure(cfgs: list[ConfigResult]) -> str:
    bad = next((c for c in cfgs if not c.correct), None)
    return f"{bad.status.value if bad.status else 'failed'}: {bad.message}" if bad else "no config ran"


# ---------------------------------------------------------------- the library call

def tune(path: Path, cases: list[Case], opts: TuneOptions, on_case: Optional[Callable[[CaseTune], None]] = None,
         log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)) -> list[CaseTune]:
    """Tune every case; winners go to the tuning table (and the ledger); returns one CaseTune per case."""
    from kopt import candidate, executor
    from kopt.errors import KoptError
    from kopt.integrity import static_check

    path = candidate.resolve(path)
    errors = [f for f in static_check(path) if f.severity == "error"]
    if errors:
        raise KoptError("static check failed: " + "; ".join(f"{f.code}: {f.message}" for f in errors)[:400])
    by_case: dict[int, list[ShardResult]] = {}
    out: list[CaseTune] = []

    with proc.reaping(), executor.make(opts.executor, opts.device, opts.gpus, opts.ray_address, opts.ray_shared,
                                       log) as ex:
        device = ex.device
        # more slots than cases: split each case's configs (every shard re-times the default)
        n_shards = max(1, ex.slots // len(cases)) if ex.parallel and cases else 1
        jobs = executor.compile_jobs(opts.compile_jobs, device, ex, opts.max_configs)
        items = [ShardItem(c, s, n_shards) for c in cases for s in range(n_shards)]

        def done(item: ShardItem, res: ShardResult) -> None:
            by_case.setdefault(item.case.id, []).append(res)
            if len(by_case[item.case.id]) == item.shards:
                if any(x.stopped for x in by_case[item.case.id]):
                    log(f"kopt tune: case {item.case.id}: not run (the budget was spent)")
                    return
                ct = finish_case(path, item.case, by_case[item.case.id], opts, parallel=ex.parallel)
                hosts = f" on {','.join(sorted({s.host or 'NA' for s in ct.shards}))}" if ex.name != "local" else ""
                what = f"not applicable: {ct.not_applicable}" if ct.not_applicable else _summary(ct)
                log(f"kopt tune: case {ct.case.id}: {len(ct.configs)} configs in {ct.wall_s:.1f} s"
                    f" ({ct.meta.device_name}{hosts}, {item.shards} shard(s)); {what}")
                out.append(ct)
                if on_case:
                    on_case(ct)

        def on_result(r):
            res = r.value if r.error is None else ShardResult(
                status=Status.crash, message=f"{ex.label}: {r.error.splitlines()[0][:300]}", wall_s=r.wall_s)
            res.host, res.retried = res.host or r.host, r.retried
            done(items[r.index], res)

        ex.run(partial(run_shard, device, replace(opts, compile_jobs=jobs)), path, items, on_result)
    order = {c.id: i for i, c in enumerate(cases)}
    return sorted(out, key=lambda ct: order[ct.case.id])


# ---------------------------------------------------------------- winner, table row, ledger row

def finish_case(path: Path, case: Case, shards: list[ShardResult], opts: TuneOptions, parallel: bool) -> CaseTune:
    """Merge shards, pick the winner, upsert the table row and append the ledger row."""
    from kopt.candidate import content_hash
    from kopt.store.calibration import aa_spread

    shards = sorted(shards, key=lambda s: 0 if s.n_configs else 1)   # a shard that loaded first (for meta)
    ct = CaseTune(case=case, shards=shards, configs=[c for s in shards for c in s.results])
    ct.wall_s = max((s.wall_s for s in shards), default=0.0) if parallel else sum(s.wall_s for s in shards)
    ct.winner, ct.default, ct.gain, ct.note = pick_winner(ct.configs, aa_spread(ct.meta.device_name))
    stopped = "; ".join(f"pairing stopped: {s.pair_error}" for s in shards if s.pair_error)
    retried = "; ".join(f"shard retried after: {s.retried}" for s in shards if s.retried)
    ct.note = "; ".join(x for x in (ct.note, stopped, retried) if x)
    if ct.winner is None:
        return ct
    chash = content_hash(Path(path))
    # a quick or partial search (--quick, --max-configs) never replaces a full one of the same kernel
    ct.row = table_row(case, ct, path, chash, quick=opts.quick or bool(opts.max_configs))
    if opts.write:
        from kopt.store import tuning

        ct.csv = Path(opts.csv) if opts.csv else tuning.default_path(ct.meta.backend or "tilelang")
        tuning.upsert(ct.csv, [ct.row])
    if opts.record:
        from kopt import paths
        from kopt.store import ledger

        ledger.append(opts.ledger or paths.ledger_file(), [ledger_row(path, case, ct, chash, opts.heldout_seed)])
    return ct


def table_row(case: Case, ct: CaseTune, path: Path, chash: str, quick: bool = False):
    """The tuning-table row of a case's winner (seqlen bucket from the cache capacity the kernel sees), stamped with the
    candidate's PLAN_VERSION."""
    from kopt.candidate import plan_version
    from kopt.store import head_short, tuning

    v, w = case.variant, ct.winner
    d_ms, w_ms = ct.times_ms()
    lo, hi = ct.gain_ci or (None, None)
    page = v.page_size or 0
    return tuning.TuningRow(
        device=ct.meta.device_name, units=ct.meta.units, dtype=v.dtype.value, head_dim=v.head_dim,
        batch=case.batch, seqlen_bucket=tuning.bucket(case.capacity), kv_heads=case.kv_heads, gqa=case.gqa,
        page_size=page, config=w.config or {}, runtime_ms=w_ms, default_runtime_ms=d_ms, gain=ct.gain,
        gain_lo=lo, gain_hi=hi, commit=head_short(Path(path).parent), candidate_id=short_id(chash), quick=bool(quick),
        host=ct.meta.host, plan_version=plan_version(Path(path)), capacity=case.capacity)


def ledger_row(path: Path, case: Case, ct: CaseTune, chash: str, heldout_seed: Optional[int] = None):
    """A mode=tune ledger row for the winner (its speedup over the baseline is a ratio of unpaired medians: no CI)."""
    import uuid

    from kopt.paths import recorded
    from kopt.records import CaseResult
    from kopt.workload import gbps

    w = ct.winner
    m = next((s for s in ct.shards if any(c is w for c in s.results)), ct.meta)
    ref_ms = m.ref_cold.median_ms if m.ref_cold else None
    t = w.paired_a if w is not ct.default and w.paired_a else w.cold   # the better-measured figure
    return CaseResult(
        row_id=uuid.uuid4().hex[:16], mode="tune", candidate_path=recorded(path), candidate_hash=chash,
        candidate_id=short_id(chash), technique="tune", config=w.config, case=case.id, case_kind=case.kind,
        variant=case.variant.label(), model=case.model, shape=case.shape_label() if case.model else None,
        heldout_seed=heldout_seed if case.kind == "heldout" else None,
        backend=m.backend, compiled=True, correct=True, status=Status.ok,
        message=f"tuned over {len(ct.configs)} configs; {_summary(ct)}",
        runtime_ms=t.median_ms, ref_runtime_ms=ref_ms, speedup=ref_ms / t.median_ms if ref_ms else None,
        gbps=gbps(case, t.median_ms), compile_s=w.compile_s, device=m.device_name, units=m.units, host=m.host,
        ref=m.ref_name, timing=t, ref_timing=m.ref_cold, validation=w.validation, versions=m.versions,
        overhead_s={"tune_wall": round(ct.wall_s, 3)}, commit=ct.row.commit if ct.row else None)


def _summary(ct: CaseTune) -> str:
    """The gain over the default in words (paired CI when there is one), and the winner rule's note."""
    parts = []
    if ct.gain:
        ci = f" (paired, CI {ct.gain_ci[0]:.4f}-{ct.gain_ci[1]:.4f})" if ct.gain_ci else ""
        parts.append(f"gain {ct.gain:.4f}x over the default{ci}")
    return "; ".join(parts + [ct.note] if ct.note else parts) or "no gain figure"
