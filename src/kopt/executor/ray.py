"""Shards as Ray tasks: `--executor ray` for `kopt tune` and `kopt verify`.

kopt schedules nothing itself here: each shard is one Ray task (`num_gpus=1` on CUDA, so Ray sets
CUDA_VISIBLE_DEVICES for it; `num_cpus=1` on the CPU device) and Ray places it. The command's own
process (the head) is the cluster's driver: it keeps every result and alone writes the tuning
table and the ledger.

The checkout: by default the workspace is shipped to the nodes as the tasks' `working_dir` (and kopt
itself as a `py_modules` entry, so every node runs the head's kopt); with `shared` every node is
expected to see the workspace at the same path and only kopt is shipped. Either way each task
hashes the candidate on its node (kopt.candidate.content_hash) before it measures anything, and a
copy whose hash is not the head's is refused (the task's side is kopt.executor.node).

Failures: a task whose worker or node dies, or that finds a stale copy, is that shard's failure,
reported in one stderr line and retried once, on another node when there is one; a second failure
is the shard's result. An exception of the shard code itself is not retried (it would fail the
same way anywhere). Ctrl-C (or any error on the head) cancels the tasks still out: Ray raises
KeyboardInterrupt inside each, so its tuning children are killed as on one host; rows already
appended stay whole (each is one locked write).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Optional

from kopt.errors import UsageError
from kopt.executor.base import Executor
from kopt.executor.node import Checkout, NodeResult, Tracker, node_task
from kopt.executor.pool import PoolResult

#: Seconds between looks at the tasks while waiting (Ctrl-C is handled at least this often).
POLL_S = 0.5
#: How long cancelled tasks get to unwind (and kill their children) before the head lets go.
CANCEL_GRACE_S = 15.0
#: Seconds to wait for a TCP answer from --ray-address (ray.init itself waits minutes on a dead address).
CONNECT_S = 5.0
#: Workspace paths never shipped: the history and the ledger are the head's alone.
EXCLUDES = [".git", "/candidates.jsonl", "/candidates.archive", "/trajectory", "__pycache__", "*.pyc", "*.egg-info",
            ".pytest_cache", ".hypothesis"]
INSTALL = 'pip install -e ".[ray]"'


class _DriverNotesToStderr:
    """sys.stdout while this process is a Ray driver: Ray's driver threads (named ray_*) print cluster notes
    ("A worker died or was killed ...") to stdout, which belongs to the machine lines and --json."""

    def __init__(self, out):
        self.out = out

    def write(self, s: str) -> int:
        """Ray's threads write to stderr, everyone else to the real stdout."""
        sink = sys.stderr if threading.current_thread().name.startswith("ray_") else self.out
        return sink.write(s)

    def __getattr__(self, name):
        return getattr(self.out, name)


class RayExecutor(Executor):
    """Shards as tasks of an existing Ray cluster, this process its driver (see the module docstring)."""

    name, label, parallel = "ray", "ray task", True

    def __init__(self, device: str, address: Optional[str] = None, shared: bool = False,
                 log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)):
        try:
            import ray  # noqa: F401
        except ImportError:
            raise UsageError(f"--executor ray needs Ray: {INSTALL}") from None
        from kopt.hardware import check_device

        check_device(device)
        self.device, self.address, self.shared, self.log = device, address, shared, log
        self._owns = False
        self._tracker = None
        self._runs = 0
        self._stdout = None

    def __enter__(self) -> RayExecutor:
        import logging

        import ray

        from kopt import paths

        self.workspace = paths.workspace()
        join = not ray.is_initialized()
        addr = self.address or os.environ.get("RAY_ADDRESS") or "auto"
        if join:
            _probe(addr)
        else:                        # a caller's own driver: its job's runtime_env stands, nothing is shipped
            self.shared = True
        try:
            if join:
                self._join(ray, addr, logging.WARNING)
            self._size_up(ray)
            here = ray.get_runtime_context().get_node_id()
            self._tracker = ray.remote(num_cpus=0)(Tracker).options(
                scheduling_strategy=_affinity(here, soft=False)).remote()
        except BaseException:
            self.close()
            raise
        return self

    def _join(self, ray, addr: str, level: int) -> None:
        """ray.init as this job's driver; local folders ship only with the job, not per task: kopt always, the
        workspace unless shared."""
        env = {"py_modules": [str(Path(__file__).resolve().parents[1])]}
        if not self.shared:
            env.update(working_dir=str(self.workspace), excludes=EXCLUDES)
        self._stdout, sys.stdout = sys.stdout, _DriverNotesToStderr(sys.stdout)
        term = signal.getsignal(signal.SIGTERM)
        try:
            ray.init(address=addr, namespace="kopt", runtime_env=env, log_to_driver=False, logging_level=level)
        except ConnectionError as e:
            raise UsageError(f"--executor ray: {e} (start one with `ray start --head`)") from None
        finally:  # ray.init installs its own SIGTERM exit (code 15); kopt's (children reaped, 143) stays
            if term is not None and threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, term)
        self._owns = True

    def _size_up(self, ray) -> None:
        """The device (auto: cuda when any node has a GPU), slots (GPUs or CPUs of live nodes) and host cores
        per slot; one stderr line on the cluster."""
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        if self.device == "auto":   # the head may have no GPU of its own: the nodes' resources decide
            self.device = "cuda" if any(n["Resources"].get("GPU", 0) >= 1 for n in nodes) else "cpu"
        self.resource = "GPU" if self.device == "cuda" else "CPU"
        have = [(n["Resources"].get(self.resource, 0.0), n["Resources"].get("CPU", 0.0)) for n in nodes]
        self.slots = int(sum(r for r, _ in have))
        if self.slots < 1:
            raise UsageError(f"--executor ray: the cluster has no {self.resource} to run a shard on")
        self.cpus_per_slot = min(c / r for r, c in have if r >= 1)
        self.log(f"kopt: ray: {len(nodes)} node(s), {self.slots} {self.resource} slot(s)"
                 f"{'' if self.shared else '; the workspace is shipped to each node'}")

    def close(self) -> None:
        """Leave the cluster when this executor joined it (Ray then ends the job's workers)."""
        import ray

        if self._owns and ray.is_initialized():
            ray.shutdown()
        elif self._tracker is not None:
            ray.kill(self._tracker)
        if self._stdout is not None:
            sys.stdout, self._stdout = self._stdout, None
        self._owns, self._tracker = False, None

    def checkout(self, path: Path) -> Checkout:
        """How the nodes find the candidate, with the hash they must find there."""
        from kopt.candidate import content_hash
        from kopt.store import head_short

        path = Path(path).resolve()
        commit = head_short(path.parent)
        env = {"KOPT_COMMIT": commit} if commit else {}   # a shipped copy has no git metadata
        if self.shared:
            return Checkout(str(path), content_hash(path), str(self.workspace), env)
        try:
            rel = path.relative_to(self.workspace.resolve())
        except ValueError:
            raise UsageError(f"--executor ray ships the workspace {self.workspace.name}/ to the nodes: the candidate "
                             f"must be inside it, or pass --ray-shared (a path every node sees)") from None
        return Checkout(str(rel), content_hash(path), None, env)

    def run(self, fn, path, items, on_result=None) -> list[PoolResult]:
        """One task per item; each result handed to on_result here as it arrives; one retry per item."""
        import ray

        co = self.checkout(Path(path))
        self._runs += 1
        run_no = self._runs
        task = ray.remote(max_retries=0, **({"num_gpus": 1} if self.resource == "GPU" else {"num_cpus": 1}))(node_task)
        refs: dict = {}
        results: dict[int, PoolResult] = {}
        first: dict[int, str] = {}

        def submit(i: int, attempt: int, node: Optional[str] = None) -> None:
            # soft: anywhere else if that node goes too
            opts = {"scheduling_strategy": _affinity(node, soft=True)} if node else {}
            t = task.options(**opts) if opts else task
            refs[t.remote(fn, co, self._tracker, (run_no, i, attempt), items[i])] = (i, attempt)

        try:
            for i in range(len(items)):
                submit(i, 0)
            while refs:
                ready, _ = ray.wait(list(refs), num_returns=1, timeout=POLL_S)
                for ref in ready:
                    i, attempt = refs.pop(ref)
                    r, node, failure = self._collect(ref, (run_no, i, attempt))
                    if failure and attempt == 0:
                        first[i] = failure
                        other = self._other_node(node) if node else None
                        self.log(f"kopt: ray: shard {i + 1}/{len(items)} {failure}; retrying once "
                                 f"{'on another node' if other else 'wherever Ray places it (no other node known)'}")
                        submit(i, 1, other)
                        continue
                    if failure:
                        r = PoolResult(i, None, error=f"{first[i]}; then, retried: {failure}", host=r.host)
                    r.retried = first.get(i)
                    results[i] = r
                    if on_result:
                        on_result(r)
        except BaseException:
            self._cancel(refs)
            raise
        return [results[i] for i in range(len(items))]

    def _collect(self, ref, key: tuple) -> tuple[PoolResult, Optional[str], Optional[str]]:
        """(the result, the node it ran on, why it must be retried: None when it is final)."""
        import ray
        from ray.exceptions import RayError, RayTaskError, TaskCancelledError

        i = key[1]
        try:
            nr: NodeResult = ray.get(ref)
        except (RayTaskError, TaskCancelledError) as e:  # the shard code raised (the same on any node), or Ctrl-C
            node, host = self._where(key)
            cause = getattr(e, "cause", None) or e
            return PoolResult(i, None, error=f"raised on host {host}: {type(cause).__name__}: {cause}"[:2000],
                              host=host), node, None
        except RayError as e:                            # its worker or node died (killed, lost, out of memory)
            node, host = self._where(key)
            return PoolResult(i, None, host=host), node, f"died on host {host} ({type(e).__name__})"
        if nr.refused:
            return PoolResult(i, nr.gpu, host=nr.host), nr.node_id, f"refused on host {nr.host}: {nr.refused}"
        return PoolResult(i, nr.gpu, nr.value, wall_s=nr.wall_s, host=nr.host), nr.node_id, None

    def _where(self, key: tuple) -> tuple[Optional[str], str]:
        import ray

        try:
            got = ray.get(self._tracker.where.remote(key), timeout=10)
        except Exception:  # the tracker itself is gone: the failure is still reported, without its node
            got = None
        return got if got else (None, "NA")

    def _other_node(self, avoid: Optional[str]) -> Optional[str]:
        """A live node with the shard's resource other than `avoid` (None when there is none)."""
        import ray

        for n in ray.nodes():
            if n.get("Alive") and n["NodeID"] != avoid and n["Resources"].get(self.resource, 0) >= 1:
                return n["NodeID"]
        return None

    def _cancel(self, refs: dict) -> None:
        """Cancel the tasks still out and give them a moment to kill their children."""
        import ray

        if not refs:
            return
        for ref in refs:
            ray.cancel(ref)
        self.log(f"kopt: ray: cancelled {len(refs)} task(s)")
        ray.wait(list(refs), num_returns=len(refs), timeout=CANCEL_GRACE_S)


def _affinity(node_id: str, soft: bool):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=soft)


def _probe(addr: str) -> None:
    """A host:port address must answer a TCP connect first: ray.init waits minutes on a dead one."""
    if addr == "auto" or "://" in addr or ":" not in addr:
        return
    host, _, port = addr.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_S).close()
    except (OSError, ValueError):
        raise UsageError(f"--ray-address {addr}: no Ray cluster answers there (start one with `ray start --head`)") \
            from None
