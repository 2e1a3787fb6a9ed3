"""Where shards run: this host (in this process, or one worker process per GPU: kopt.executor.pool) or the
tasks of a Ray cluster (kopt.executor.ray, its node side kopt.executor.node). `kopt tune` and `kopt verify`
hand their shards to an Executor from `make`; the head process alone writes the tuning table and the ledger.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Optional

from kopt.errors import UsageError
from kopt.executor.base import EXECUTORS, Executor, LocalExecutor, compile_jobs
from kopt.executor.pool import PoolResult

__all__ = ["EXECUTORS", "Executor", "LocalExecutor", "PoolResult", "compile_jobs", "make"]


def make(kind: str, device: str, gpus: Optional[str] = None, address: Optional[str] = None, shared: bool = False,
         log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)) -> Executor:
    """The executor for `--executor kind` and `--device device` (auto | cuda | cpu: resolved on this host for
    local, against the cluster's resources for ray); a bad combination of options is a UsageError (exit 2)."""
    from kopt.executor import pool
    from kopt.hardware import resolve_device

    if kind not in EXECUTORS:
        raise UsageError(f"unknown executor {kind!r}; use {' or '.join(EXECUTORS)}")
    if kind == "local":
        if address or shared:
            raise UsageError("--ray-address and --ray-shared need --executor ray")
        device = resolve_device(device)
        return LocalExecutor(pool.plan(gpus, device, warn=log), device)
    if gpus is not None:
        raise UsageError("--gpus spreads over this host's GPUs (the local executor); "
                         "with --executor ray every shard takes one GPU of the cluster")
    from kopt.executor.ray import RayExecutor

    return RayExecutor(device, address=address, shared=shared, log=log)
