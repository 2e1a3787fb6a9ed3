"""Where shards run: on this host (the local executor) or as tasks of a Ray cluster (kopt.executor.ray).

A shard is one unit of work whose result the head needs: a case (or a case x config batch) of
`kopt tune`, one row of `kopt verify`. A shard function is a module-level `fn(path, item) -> value`
(it must pickle): the executor passes the candidate's path as the machine running it sees it.
`Executor.run` returns one PoolResult (kopt.executor.pool) per item, in item order, and hands each to
`on_result` as it arrives, in the calling process: that process (the head) is the one writer of
the tuning table and the ledger, whichever executor ran the shards.

The Verdict's shard function and its spread run live with the Verdict (kopt.eval.verdict). The local
executor is today's single-host machinery: items in this process one after the other,
or one worker process per GPU with `--gpus N` (kopt.executor.pool).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

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

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Release what the executor holds (nothing for the local one)."""


class LocalExecutor(Executor):
    """This host: in this process, or one worker process per GPU (kopt.executor.pool) when given several GPU ids."""

    def __init__(self, gpus: Sequence[str] = (), device: str = "cpu"):
        self.gpus, self.device = list(gpus), device
        self.parallel = bool(self.gpus)
        self.slots = max(1, len(self.gpus))
        self.cpus_per_slot = (os.cpu_count() or 2) / self.slots

    def run(self, fn, path, items, on_result=None) -> list[PoolResult]:
        """Pool workers with GPUs, else a plain loop (an exception ends the run, as a serial run always did)."""
        from functools import partial

        from kopt.executor import pool

        if self.gpus:
            return pool.run(partial(fn, str(path)), items, self.gpus, on_result=on_result)
        out = []
        for i, it in enumerate(items):
            out.append(PoolResult(i, None, fn(str(path), it), host=socket.gethostname()))
            if on_result:
                on_result(out[-1])
        return out


def compile_jobs(requested: Optional[int], device: str, ex: Executor, max_configs: Optional[int]) -> int:
    """Prewarm children per tuning shard: as asked, else none on the CPU, else half the cores of a slot, at most 8."""
    jobs = requested
    if jobs is None:       # nvcc per kernel is seconds: compile in parallel on the host's cores
        jobs = 0 if device == "cpu" else max(1, min(8, int(ex.cpus_per_slot // 2)))
    return min(jobs, max_configs) if max_configs else jobs
