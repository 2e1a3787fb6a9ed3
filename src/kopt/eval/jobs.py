"""What an evaluation parent and its child exchange: the job (job.json), the saved outputs, the result
(result.json, rewritten after every phase), and how a child ended."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, Field

from kopt.cases import Case
from kopt.records import FlushKind, PeerResult, Replay, Status, TimingStats

#: What the child prepares while it waits for its jobs ("cuda": its context, "tilelang": the import).
ENV_WARM = "KOPT_CHILD_WARM"
#: The parent's wall clock when it started the child (the child reports its start-up from it).
ENV_T0 = "KOPT_CHILD_T0"

#: The file in a job's folder that releases its timed calls (kopt.eval.child.run_jobs: the parent is idle then).
GATE_FILE = "go"

#: Text of a CUDA fault in an exception or a child's stderr (a crash, whatever raised it).
CUDA_FAULTS = ("illegal memory access", "CUDA error", "device-side assert")


def fresh_seed() -> int:
    """A seed nobody chose: inputs a candidate cannot have seen (every bench and tuning job draws its own)."""
    return int.from_bytes(os.urandom(4), "little") % 1_000_000_007


class Job(BaseModel):
    """What the child evaluates: one candidate on one case, written as job.json."""

    candidate_path: str
    case: Case
    device: str
    seeds_correct: list[int]
    seeds_timing: list[int]
    refill_seed: Optional[int] = None
    do_timing: bool = True
    cold: bool = True
    graph: bool = False
    replay: Replay = "graph"
    flush: FlushKind = "read"
    quick: bool = False
    baseline: str = "auto"
    pair: str = "ab"
    """ab: candidate vs baseline; aa_base / aa_cand: A/A runs of the baseline / candidate against itself."""
    config: Optional[dict] = None
    out_dir: str
    peers: list[str] = Field(default_factory=list)
    """kopt peers: time the candidate against each of these (kopt.baselines.PEERS) instead of the baseline."""
    gate: bool = False
    """Wait for GATE_FILE in out_dir before the timed calls: the parent checks the previous job's outputs
    meanwhile, and its work must not run beside a timing (on a 2-core CPU, or on the same GPU)."""


class SavedOutput(BaseModel):
    """A candidate output the child saved for the parent to check against the reference."""

    file: str
    seed: int
    kind: str  # correct | spot | refill


class WorkerResult(BaseModel):
    """What the child reports back in result.json (rewritten after every phase)."""

    phase: str = "start"
    status: Optional[Status] = None
    message: str = ""
    backend: str = "NA"
    compile_s: Optional[float] = None
    plan: Optional[dict] = None
    outputs: list[SavedOutput] = Field(default_factory=list)
    timing: Optional[TimingStats] = None
    ref_timing: Optional[TimingStats] = None
    ratios: list[float] = Field(default_factory=list)
    speedup: Optional[float] = None
    speedup_ci: Optional[tuple[float, float]] = None
    ref_name: str = "NA"
    baseline_failed: bool = False
    ref_note: str = ""
    device_name: str = "NA"
    versions: dict[str, str] = Field(default_factory=dict)
    overhead_s: dict[str, float] = Field(default_factory=dict)
    peers: list[PeerResult] = Field(default_factory=list)


@dataclass
class Outcome:
    """How the child ended, plus its last reported result (if any)."""

    result: Optional[WorkerResult]
    returncode: Optional[int]
    timed_out: bool
    wall_s: float
    stderr_tail: str

    def failure(self) -> Optional[tuple[Status, str]]:
        """(status, message) when the child did not finish normally, else None."""
        r = self.result
        phase = r.phase if r else "start"
        if self.timed_out:
            return Status.timeout, f"no result within the time limit (phase {phase})"
        if r and r.phase == "done":
            return None if r.status in (None, Status.ok) else (r.status, r.message)
        rc = self.returncode
        if rc is not None and rc < 0:
            name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else str(-rc)
            return Status.crash, f"child killed by {name} in phase {phase}"
        tail = self.stderr_tail.strip().splitlines()[-1:] or [""]
        if "out of memory" in self.stderr_tail.lower():
            return Status.oom, f"out of memory in phase {phase}"
        if any(s in self.stderr_tail for s in CUDA_FAULTS):
            return Status.crash, f"CUDA fault in phase {phase}: {tail[0][:160]}"
        return Status.crash, f"child exited with code {rc} in phase {phase} without a result {tail[0][:120]}".strip()


def read_result(out_dir: Path) -> Optional[WorkerResult]:
    """The child's last complete result.json, or None."""
    f = Path(out_dir) / "result.json"
    try:
        return WorkerResult.model_validate_json(f.read_text())
    except (OSError, ValueError):
        return None


def write_result(out_dir: Path, r: WorkerResult) -> None:
    """Atomic write of result.json (write, then rename) so the parent never reads half a file."""
    from kopt import atomic

    atomic.write_text(Path(out_dir) / "result.json", r.model_dump_json(), fsync=False)
