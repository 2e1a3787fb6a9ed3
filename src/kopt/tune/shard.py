"""One shard of a tuning run: prewarm children, the timing child (rerun past crashes), output checks.

The timing child screens the shard's configs and then pairs the finalists with the default
(kopt.tune.worker). A rerun child gets the earlier children's results (`prior`) and pairs over all
of them; when no child got to the finalists (the last config crashed, a graph capture failed), one
more child only pairs them.

Runs in the `kopt tune` process, in a pool worker pinned to one GPU (kopt.executor.pool), or in a Ray task on a node
of a cluster (kopt.executor); children run in their own
sessions and are killed with this process (SIGTERM, Ctrl-C, errors), so a bounded run leaves no
orphan on the GPU.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from kopt import proc
from kopt.cases import Case
from kopt.eval.jobs import fresh_seed
from kopt.records import Status
from kopt.tune.models import ConfigResult, ShardResult, TuneJob
from kopt.tune.pick import pick_finalists

if TYPE_CHECKING:
    from kopt.tune import TuneOptions


@dataclass
class ShardItem:
    """One unit of pool work: a shard of one case's configs."""

    case: Case
    shard: int = 0
    shards: int = 1


def run_shard(device: str, opts: TuneOptions, path: str, item: ShardItem) -> ShardResult:
    """Prewarm, then time the shard's configs in a child (rerun past crashes), then check outputs here.
    The executor's shard function (module level: it pickles to a pool worker or a Ray node)."""
    t0 = time.perf_counter()
    if opts.deadline is not None and time.time() >= opts.deadline:  # the budget is spent: not started
        return ShardResult(stopped=True, message="not run: the budget was spent")
    s0 = fresh_seed()
    base = dict(candidate_path=path, case=item.case, device=device, shard=item.shard, shards=item.shards,
                max_configs=opts.max_configs, seeds_correct=[s0], seeds_timing=[s0, fresh_seed()],
                quick=opts.quick, hot=opts.hot, baseline=opts.baseline, finalists=opts.finalists,
                configs=opts.configs)
    work = Path(tempfile.mkdtemp(prefix="kopt-tune-"))
    try:
        with proc.reaping():
            if (opts.compile_jobs or 0) > 1:
                _prewarm(base, work, opts.compile_jobs, opts.timeout_s)
            merged = _timed(base, work, opts)
            if merged.results:
                _check(merged, item.case, device, opts.baseline)
    finally:
        if opts.keep_dir:
            shutil.copytree(work, Path(opts.keep_dir) / f"case{item.case.id}-shard{item.shard}", dirs_exist_ok=True)
        shutil.rmtree(work, ignore_errors=True)
    merged.stopped = opts.deadline is not None and time.time() >= opts.deadline  # cut by the budget: not a result
    merged.wall_s = time.perf_counter() - t0
    merged.host = socket.gethostname()
    merged.overhead_s["shard_wall"] = round(merged.wall_s, 3)
    return merged


def _launch(job: TuneJob) -> subprocess.Popen:
    out = Path(job.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "job.json").write_text(job.model_dump_json())
    return proc.spawn(proc.python_module("kopt.tune.worker", str(out / "job.json")), out / "child.log")


def _read(out: Path) -> Optional[ShardResult]:
    try:
        return ShardResult.model_validate_json((out / "result.json").read_text())
    except (OSError, ValueError):
        return None


def _prewarm(base: dict, work: Path, jobs: int, timeout_s: float) -> None:
    """Compile the shard's configs in `jobs` children at once; their results are never used, only the disk cache."""
    ps = [_launch(TuneJob(**base, prewarm=True, part=j, parts=jobs, out_dir=str(work / f"prewarm{j}")))
          for j in range(jobs)]
    deadline = time.perf_counter() + timeout_s
    for p in ps:
        proc.wait(p, deadline)


def _timed(base: dict, work: Path, opts: TuneOptions) -> ShardResult:
    """The timing child, rerun on the configs left after a crash or timeout (the config in progress is blamed).

    A child that ends without finishing or blaming any config stops the shard (a rerun would
    fail the same way), as does a failure before the first config (import, configs()).
    """
    merged = ShardResult()
    done: dict[int, ConfigResult] = {}
    indices = None
    for attempt in range(opts.max_reruns + 1):
        out = work / f"run{attempt}"
        res, timed_out, why = _child(TuneJob(**base, indices=indices, prior=list(done.values()), out_dir=str(out)),
                                     opts)
        if res is None:
            merged.status = merged.status or (Status.timeout if timed_out else Status.crash)
            merged.message = f"tuning child {why}"
            break
        if attempt == 0:
            merged = res.model_copy(update={"results": []})
        if res.hot_error:                            # a capture that failed once fails again: skip it
            base = dict(base, hot=False)
            merged.hot_error = merged.hot_error or res.hot_error
        before = len(done)
        new = _merge(done, res, out)
        _take_pairs(merged, res, why)
        if res.current is not None and res.current not in done:
            done[res.current] = ConfigResult(index=res.current, shard=base["shard"], config=res.current_config,
                                             status=Status.timeout if timed_out else Status.crash,
                                             message=f"tuning child {why} on this config")
        if res.phase == "done" and res.status not in (None, Status.ok) and not new:
            merged.status, merged.message = res.status, res.message
            break
        indices = [i for i in res.indices if i not in done]
        if not indices:
            break
        if len(done) == before:
            merged.message = f"tuning child {why} in phase {res.phase}; {len(indices)} config(s) not run"
            break
    if merged.finalists is None and merged.status in (None, Status.ok) and pick_finalists(list(done.values()),
                                                                                          opts.finalists):
        _pair_only(base, work, opts, done, merged)
    merged.results = [done[i] for i in sorted(done)]
    return merged


def _child(job: TuneJob, opts: TuneOptions) -> tuple[Optional[ShardResult], bool, str]:
    """Run one tuning child to its end or its time limit: (its report or None, timed out, how it ended)."""
    out = Path(job.out_dir)
    limit = opts.timeout_s if opts.deadline is None else min(opts.timeout_s, max(1.0, opts.deadline - time.time()))
    rc, timed_out = proc.wait(_launch(job), time.perf_counter() + limit)
    why = "timed out" if timed_out else f"died (code {rc})"
    res = _read(out)
    if res is None:
        tail = (out / "child.log").read_bytes()[-2000:].decode(errors="replace").strip().splitlines()[-1:]
        why = f"{why} before reporting: {' '.join(tail)[:200]}"
    return res, timed_out, why


def _merge(done: dict[int, ConfigResult], res: ShardResult, out: Path) -> list[int]:
    """Take a child's results into `done` (its copies of earlier ones carry its pairings); returns the new indices."""
    new = [cr.index for cr in res.results if cr.index not in done]
    for cr in res.results:
        if cr.dir and not Path(cr.dir).is_absolute():
            cr.dir = str(out / cr.dir)
        done[cr.index] = cr
    return new


def _pair_only(base: dict, work: Path, opts: TuneOptions, done: dict[int, ConfigResult], merged: ShardResult) -> None:
    """One more child that screens nothing and pairs the finalists of what the earlier children screened."""
    out = work / "finalists"
    res, _, why = _child(TuneJob(**base, indices=[], prior=list(done.values()), out_dir=str(out)), opts)
    if res is None or res.finalists is None:
        merged.pair_error = f"finalist child {why}" if res is None else f"finalist child: {res.message or why}"
        return
    _merge(done, res, out)
    _take_pairs(merged, res, why)


def _take_pairs(merged: ShardResult, res: ShardResult, why: str) -> None:
    """Note the finalists of a child that got to them (a crash while pairing is not rerun: the finished pairs stand)."""
    if res.finalists is not None:
        merged.finalists = res.finalists
        merged.pair_error = res.pair_error or (None if res.phase == "done" else f"tuning child {why} while pairing")


def _check(shard: ShardResult, case: Case, device: str, prefer: str) -> None:
    """Each config's saved outputs against the fp32 reference of the same seed; then the plausibility guard."""
    from kopt import baselines, hardware
    from kopt.eval import checks
    from kopt.workload import gbps as gbps_of

    base = baselines.pick(case, device, prefer)
    cache: dict[int, tuple] = {}  # every seed's inputs, reference and baseline, shared by the configs
    for cr in shard.results:
        if cr.status != Status.ok:
            cr.correct = False
            continue
        status, cr.validation, _ = checks.check_outputs(case, device, base, cr.outputs, Path(cr.dir), cache)
        cr.correct = status == Status.ok
        if not cr.correct:
            cr.status, cr.message = status, cr.validation.detail
    ceiling = hardware.copy_ceiling_gbps(device) if device != "cpu" else None
    for cr in shard.results:
        gbps = gbps_of(case, cr.cold.median_ms) if cr.correct and cr.cold else None
        if gbps and cr.cold.cold and checks.implausible(gbps, ceiling):
            cr.correct, cr.status = False, Status.implausible
            cr.message = checks.implausible_message(gbps, ceiling, "copy ceiling")
    del cache
    if device != "cpu":
        import torch

        torch.cuda.empty_cache()
