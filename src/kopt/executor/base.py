"""Where shards run: on this host (the local executor) or as tasks of a Ray cluster (kopt.executor.ray).

A shard is one unit of work whose result the head needs: a case (or a case x config batch) of
`kopt tune`, one row of `kopt verify`. A shard function is a module-level `fn(path, item) -> value`
(it must pickle): the executor passes the candidate's path as the machine running it sees it.
`Executor.run` returns one gpupool.PoolResult per item, in item order, and hands each to
`on_result` as it arrives, in the calling process: that process (the head) is the one writer of
the tuning table and the ledger, whichever executor ran the shards.

The local executor is today's single-host machinery: items in this process one after the other,
or one worker process per GPU with `--gpus N` (kopt.executor.pool).
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from kopt.errors import UsageError
from kopt.executor.pool import PoolResult

EXECUTORS = ("local", "ray")


class Executor:
    """Runs shard functions over items; a context manager (the Ray one joins its cluster on enter)."""

    name = "local"
    device = "cpu"
    """The device the shards run on (resolved: cuda or cpu)."""
    label = "pool worker"
    """How a failure text names the thing that failed."""
    slots = 1
    """Shards that can run at once (GPUs, or CPUs for a CPU run of a cluster)."""
    cpus_per_slot = float(os.cpu_count() or 2)
    """Host cores per slot, for the prewarm children of a tuning shard."""
    parallel = False
    """Whether shards run at the same time (a case's wall time is then its slowest shard's)."""

    def run(self, fn: Callable[[str, Any], Any], path: Path, items: Sequence[Any],
            on_result: Optional[Callable[[PoolResult], None]] = None) -> list[PoolResult]:
        """fn(path, item) for every item; results in item order, each also given to on_result as it arrives."""
        raise NotImplementedError

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Release what the executor holds (nothing for the local one)."""


class LocalExecutor(Executor):
    """This host: in this process, or one worker process per GPU (gpupool) when given several GPU ids."""

    def __init__(self, gpus: Sequence[str] = (), device: str = "cpu"):
        self.gpus, self.device = list(gpus), device
        self.parallel = bool(self.gpus)
        self.slots = max(1, len(self.gpus))
        self.cpus_per_slot = (os.cpu_count() or 2) / self.slots

    def run(self, fn, path, items, on_result=None) -> list[PoolResult]:
        """gpupool workers with GPUs, else a plain loop (an exception ends the run, as a serial run always did)."""
        from functools import partial

        from kopt.executor import pool as gpupool

        if self.gpus:
            return gpupool.run(partial(fn, str(path)), items, self.gpus, on_result=on_result)
        out = []
        for i, it in enumerate(items):
            out.append(PoolResult(i, None, fn(str(path), it), host=socket.gethostname()))
            if on_result:
                on_result(out[-1])
        return out


def make(kind: str, device: str, gpus: Optional[str] = None, address: Optional[str] = None, shared: bool = False,
         log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)) -> Executor:
    """The executor for `--executor kind` and `--device device` (auto | cuda | cpu: resolved on this host for
    local, against the cluster's resources for ray); a bad combination of options is a UsageError (exit 2)."""
    from kopt.executor import pool as gpupool
    from kopt.eval.bench import resolve_device

    if kind not in EXECUTORS:
        raise UsageError(f"unknown executor {kind!r}; use {' or '.join(EXECUTORS)}")
    if kind == "local":
        if address or shared:
            raise UsageError("--ray-address and --ray-shared need --executor ray")
        device = resolve_device(device)
        return LocalExecutor(gpupool.plan(gpus, device, warn=log), device)
    if gpus is not None:
        raise UsageError("--gpus spreads over this host's GPUs (the local executor); "
                         "with --executor ray every shard takes one GPU of the cluster")
    from kopt.executor.ray import RayExecutor

    return RayExecutor(device, address=address, shared=shared, log=log)


def compile_jobs(requested: Optional[int], device: str, ex: Executor, max_configs: Optional[int]) -> int:
    """Prewarm children per tuning shard: as asked, else none on the CPU, else half the cores of a slot, at most 8."""
    jobs = requested
    if jobs is None:       # nvcc per kernel is seconds: compile in parallel on the host's cores
        jobs = 0 if device == "cpu" else max(1, min(8, int(ex.cpus_per_slot // 2)))
    return min(jobs, max_configs) if max_configs else jobs


# ---------------------------------------------------------------- the Verdict, spread

def verify_row(path: str, item):
    """Shard function of a spread Verdict: one row through kopt.eval.bench.evaluate, left unrecorded (the head
    appends it), naming the host and unit count of the machine that measured it."""
    from dataclasses import replace

    from kopt.eval.bench import evaluate, resolve_device
    from kopt.hardware import detect

    case, opts = item
    r = evaluate(Path(path), [case], replace(opts, record=False))[0]
    r.host = socket.gethostname()
    r.units = int(detect(resolve_device(opts.device)).units or 0)
    return r


def run_verdict(path, cf, opts, perf_ids, on_result, ex: Executor):
    """kopt.eval.verdict.run with every row (perf, matrix, hidden) a shard of `ex`: same rows, same order;
    this process appends each row to the ledger as it arrives (one writer)."""
    import uuid

    from kopt import candidate, paths
    from kopt.eval import verdict
    from kopt.workspace import ledger
    from kopt.eval.bench import _label
    from kopt.records import CaseResult, Status

    groups = verdict.plan(cf, opts, perf_ids)
    items = [it for g in groups for it in g]
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
                row_id=uuid.uuid4().hex[:16], run_id=o.run_id, mode="verdict", candidate_path=paths.relative(path),
                candidate_hash=chash, candidate_id=chash[:12], case=case.id, case_kind=case.kind,
                variant=_label(case, o.tag),
                status=Status.crash, message=f"{ex.label}: {r.error.splitlines()[0]}"[:500], host=r.host)
        return row_

    def arrived(r: PoolResult) -> None:
        if opts.record:
            ledger.append(led, [row(r)])
        if on_result:
            on_result(row(r))

    out = [row(r) for r in ex.run(verify_row, Path(path), items, arrived)]
    a, b = len(groups[0]), len(groups[0]) + len(groups[1])
    return verdict.Verdict(out[:a], out[a:b], out[b:])


def verdict_on(path, cf, opts, perf_ids, on_result, ex: Executor):
    """The Verdict on an executor: kopt.eval.verdict.run in this host's order when it runs serially, else spread."""
    from dataclasses import replace

    from kopt.eval import verdict

    opts = replace(opts, device=ex.device)   # what the executor reserved (a GPU per task, or a CPU)
    if not ex.parallel:
        return verdict.run(path, cf, opts, perf_ids, on_result)
    return run_verdict(path, cf, opts, perf_ids, on_result, ex)
