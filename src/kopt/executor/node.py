"""The node side of `--executor ray`: what one Ray task does on the machine it lands on.

A task records where it runs (with the head's Tracker actor: a task that dies cannot say so
itself), points kopt at this node's copy of the workspace (shipped as the job's working_dir, or a
shared path), refuses a candidate whose content hash is not the head's, and only then runs the
shard function. Imported by Ray workers through the shipped kopt; `import ray` inside functions only.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional


@dataclass
class Checkout:
    """What a task needs to find and check the candidate on its node."""

    path: str
    """Relative to the workspace when shipped, else the head's absolute path."""
    content_hash: str
    workspace: Optional[str] = None
    """The workspace on the node; None: shipped, the task's working directory."""
    env: dict = field(default_factory=dict)


@dataclass
class NodeResult:
    """What a task sends back: where it ran, and the shard's value or why it refused to measure."""

    host: str
    node_id: str
    gpu: Optional[str] = None
    value: Any = None
    refused: Optional[str] = None
    wall_s: float = 0.0


class Tracker:
    """Where each task started: a task that dies cannot say so itself (a Ray actor on the head's node)."""

    def __init__(self):
        self.at: dict = {}

    def started(self, key, node_id: str, host: str) -> None:
        """Record the node of task `key`."""
        self.at[key] = (node_id, host)

    def where(self, key):
        """(node id, host) of task `key`, or None when it never started."""
        return self.at.get(key)


def stale_copy(path: str, expected: str) -> Optional[str]:
    """Why the candidate at `path` on this machine is not the head's (another content hash), or None."""
    from kopt.candidate import content_hash

    try:
        got = content_hash(Path(path))
    except OSError as e:
        return f"candidate not readable here: {e.strerror or e}"
    if got != expected:
        return f"stale copy of the candidate (hash {got[:12]}, the head's is {expected[:12]}), not measured"
    return None


def node_task(fn: Callable[[str, Any], Any], co: Checkout, tracker, key, item) -> NodeResult:
    """The body of every task: say where it runs, point kopt at this node's copy, check it, run the shard."""
    import ray

    t0 = time.perf_counter()
    host, node = socket.gethostname(), ray.get_runtime_context().get_node_id()
    ray.get(tracker.started.remote(key, node, host))   # before anything that could kill this worker
    ws = co.workspace or os.getcwd()                    # a shipped workspace is the task's working directory
    os.environ.update(co.env, KOPT_WORKSPACE=ws)
    path = str(Path(ws) / co.path)
    gpu = ",".join(str(g) for g in ray.get_gpu_ids()) or None
    why = stale_copy(path, co.content_hash)
    if why:
        return NodeResult(host, node, gpu, refused=why)
    return NodeResult(host, node, gpu, value=fn(path, item), wall_s=time.perf_counter() - t0)
