"""Spread work items over the GPUs of one host: one worker process per GPU, pinned by CUDA_VISIBLE_DEVICES.

The parent hands each worker one item at a time (so it always knows which item a worker holds),
collects results in item order, and survives a worker that dies: the item it held becomes an
error and a fresh worker takes its GPU. The GPU list is injectable, so the pool logic is tested
with fake devices and plain Python functions; on a machine with fewer than two GPUs callers fall
back to running serially (`plan` says so in one stderr line).

This is a single-host pool, not a scheduler: across hosts the same per-item functions run as Ray
tasks (kopt.executor.ray, `--executor ray`); kopt.executor puts both behind one interface.
"""

from __future__ import annotations

import os
import queue
import socket
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from kopt.errors import UsageError

ENV = "CUDA_VISIBLE_DEVICES"
#: How often the parent checks for dead workers while waiting for results (seconds).
POLL_S = 0.5
#: Replacement workers per GPU before its remaining items are failed instead.
MAX_RESTARTS = 3


@dataclass
class PoolResult:
    """What one item gave: the value, or an error text; and the GPU (and host) it ran on."""

    index: int
    gpu: Optional[str]
    value: Any = None
    error: Optional[str] = None
    wall_s: float = 0.0
    host: Optional[str] = None
    retried: Optional[str] = None
    """Why the item ran a second time (its first attempt's node or worker died: Ray only)."""


def visible_gpus() -> list[str]:
    """GPU ids this process may use: the CUDA_VISIBLE_DEVICES entries when set, else 0..n-1; [] without CUDA."""
    try:
        import torch

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken driver install is "no GPU" for scheduling purposes
        n = 0
    vis = os.environ.get(ENV)
    if vis is not None:
        return [x.strip() for x in vis.split(",") if x.strip()][:n]
    return [str(i) for i in range(n)]


def parse_spec(spec: Optional[str]) -> Optional[int]:
    """--gpus text -> a count (None: all); raises UsageError on anything but a positive int or `all`."""
    if spec is None or str(spec).strip().lower() == "all":
        return None
    try:
        n = int(str(spec).strip())
    except ValueError:
        raise UsageError(f"--gpus must be a positive number or 'all' (got {spec!r})") from None
    if n < 1:
        raise UsageError(f"--gpus must be >= 1 (got {n})")
    return n


def plan(spec: Optional[str], device: str = "cuda", available: Optional[Sequence[str]] = None,
         warn: Callable[[str], None] = lambda m: print(m, file=sys.stderr)) -> list[str]:
    """The GPU ids to spread over for `--gpus spec`; [] means run serially (one line on stderr says why)."""
    if spec is None:
        return []
    want = parse_spec(spec)
    if want == 1:
        return []
    gpus = list(available) if available is not None else ([] if device == "cpu" else visible_gpus())
    if device == "cpu" or len(gpus) < 2:
        where = "a CPU run" if device == "cpu" else f"{len(gpus)} GPU visible"
        warn(f"kopt: --gpus {spec}: {where}; running serially")
        return []
    if want is not None and want > len(gpus):
        warn(f"kopt: --gpus {spec}: only {len(gpus)} GPUs visible; using {len(gpus)}")
    return gpus[:want] if want is not None else gpus


def _worker(gpu: str, fn: Callable[[Any], Any], inq, outq) -> None:
    """Worker loop: pin the GPU before anything touches CUDA, then run items until the sentinel."""
    os.environ[ENV] = gpu
    while True:
        job = inq.get()
        if job is None:
            return
        idx, item = job
        t0 = time.perf_counter()
        try:
            outq.put(("done", gpu, idx, fn(item), None, time.perf_counter() - t0))
        except BaseException as e:  # an item's failure is a result, never the end of the worker
            tb = traceback.format_exc(limit=3)
            outq.put(("done", gpu, idx, None, f"{type(e).__name__}: {e}\n{tb}"[:2000], time.perf_counter() - t0))


def run(fn: Callable[[Any], Any], items: Sequence[Any], gpus: Sequence[str],
        on_result: Optional[Callable[[PoolResult], None]] = None, start_method: str = "spawn") -> list[PoolResult]:
    """fn(item) for every item on one worker process per GPU; results in item order, each item done once.

    `fn` and the items must pickle (a module-level function, a functools.partial of one).
    """
    import multiprocessing as mp

    if not gpus:
        raise ValueError("run() needs at least one GPU id; call fn serially instead")
    ctx = mp.get_context(start_method)
    outq = ctx.Queue()
    todo = list(enumerate(items))[::-1]              # popped from the end: item order
    results: dict[int, PoolResult] = {}
    workers: dict[str, tuple] = {}                   # gpu -> (process, inq)
    held: dict[str, Optional[int]] = {}
    restarts = {g: 0 for g in gpus}

    def start(g: str) -> None:
        inq = ctx.Queue()
        p = ctx.Process(target=_worker, args=(g, fn, inq, outq), daemon=True, name=f"kopt-gpu{g}")
        p.start()
        workers[g], held[g] = (p, inq), None

    def feed(g: str) -> None:
        if todo:
            idx, item = todo.pop()
            held[g] = idx
            workers[g][1].put((idx, item))
        else:
            held[g] = None
            workers[g][1].put(None)

    def finish(r: PoolResult) -> None:
        results[r.index] = r
        if on_result:
            on_result(r)

    complete = False
    try:
        for g in gpus:
            start(g)
            feed(g)
        while len(results) < len(items):
            try:
                _, g, idx, value, error, wall = outq.get(timeout=POLL_S)
            except queue.Empty:
                _reap(workers, held, restarts, start, feed, finish, todo)
                continue
            if idx not in results:                   # not already failed by _reap in a race
                finish(PoolResult(idx, g, value, error, wall, host=socket.gethostname()))
            if held.get(g) == idx:
                feed(g)
        complete = True
    finally:
        for p, inq in workers.values():
            if p.is_alive():
                inq.put(None)
        for p, _ in workers.values():
            p.join(timeout=5 if complete else 0.1)
            if p.is_alive():                         # interrupted mid-item: SIGTERM lets it clean up its children
                p.terminate()
                p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    return [results[i] for i in range(len(items))]


def _reap(workers, held, restarts, start, feed, finish, todo) -> None:
    """Dead workers: their held item fails; a fresh worker takes the GPU (or its share fails after MAX_RESTARTS)."""
    for g, (p, _) in list(workers.items()):
        if p.is_alive() or held[g] is None:
            continue
        idx = held[g]
        held[g] = None
        finish(PoolResult(idx, g, None, f"worker on GPU {g} died (exit code {p.exitcode})"))
        restarts[g] += 1
        if restarts[g] <= MAX_RESTARTS:
            start(g)
            feed(g)
        elif not any(q.is_alive() for q, _ in workers.values()):
            while todo:                              # no GPU left to run them
                i, _ = todo.pop()
                finish(PoolResult(i, None, None, "no live GPU worker left"))
