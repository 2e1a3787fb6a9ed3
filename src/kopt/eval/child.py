"""Run one evaluation in a child process with a wall-clock timeout; survive whatever the child does."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from pydantic import BaseModel, Field

from kopt.cases import Case
from kopt.records import FlushKind, PeerResult, Status, TimingStats


#: What the child prepares while it waits for its jobs ("cuda": its context, "tilelang": the import).
ENV_WARM = "KOPT_CHILD_WARM"
#: The parent's wall clock when it started the child (the child reports its start-up from it).
ENV_T0 = "KOPT_CHILD_T0"

#: Text of a CUDA fault in an exception or a child's stderr (a crash, whatever raised it).
CUDA_FAULTS = ("illegal memory access", "CUDA error", "device-side assert")


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
    flush: FlushKind = "read"
    quick: bool = False
    baseline: str = "auto"
    pair: str = "ab"
    """ab: candidate vs baseline; aa_base / aa_cand: A/A runs of the baseline / candidate against itself."""
    config: Optional[dict] = None
    out_dir: str
    peers: list[str] = Field(default_factory=list)
    """kopt peers: time the candidate against each of these (kopt.baselines.PEERS) instead of the baseline."""


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


class Child:
    """One evaluation child (`python -m kopt.eval.worker`, in its own session), started before its jobs exist.

    It imports torch and the harness (and, as `warm` asks, creates its CUDA context and imports
    tilelang: library code only, never the candidate's), then waits for the path of jobs.json on its
    stdin: started first thing, its interpreter start and `import torch` (seconds on some hosts)
    overlap the parent's own preparation. Its output goes to child.log in a folder of its own (the
    jobs' folders do not exist yet). A parent that never sends jobs ends it with `close`; one that dies
    closes the pipe, and the child, reading end of file, exits.
    """

    def __init__(self, warm: tuple[str, ...] = ()):
        self.dir = Path(tempfile.mkdtemp(prefix="kopt-eval-"))
        self.log = self.dir / "child.log"
        self.started = time.perf_counter()
        env = child_env()
        env[ENV_WARM] = ",".join(warm)
        env[ENV_T0] = repr(time.time())
        with open(self.log, "wb") as log:
            self.popen = subprocess.Popen([sys.executable, "-m", "kopt.eval.worker"], stdin=subprocess.PIPE,
                                          stdout=log, stderr=subprocess.STDOUT, env=env,
                                          start_new_session=True)

    def send(self, jobs_file: Path) -> None:
        """Hand the child its jobs; stdin is closed after them (a candidate reading it sees end of file)."""
        try:
            self.popen.stdin.write(f"{jobs_file}\n".encode())
            self.popen.stdin.close()
        except BrokenPipeError:  # it died starting up: its exit code and log say why
            pass

    def tail(self) -> str:
        """The end of the child's output (the failure reports quote its last line)."""
        return self.log.read_bytes()[-4000:].decode(errors="replace")

    def close(self) -> None:
        """End the child and what it started unless it has exited; remove its log. Safe to call twice."""
        if self.popen.poll() is None:
            kill_group(self.popen)
        self.popen.wait()
        self.popen.stdin.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def run_jobs(jobs: list[Job], timeout_s: float,
             on_done: Optional[Callable[[int], None]] = None,
             on_start: Optional[Callable[[], None]] = None,
             child: Optional[Child] = None) -> list[Outcome]:
    """Evaluate jobs in as few children as possible, each job within `timeout_s`.

    One child runs the jobs in order (imports and compile caches are paid once): `child` when the
    caller started one early, else a fresh one. When a job kills or hangs its child, that job gets
    the failure and the jobs after it run in a fresh child. `on_start` is called once, right after
    the first child was given its jobs (work to overlap with it). Each child is closed when its
    batch ends.
    """
    outcomes: list[Optional[Outcome]] = [None] * len(jobs)
    start = 0
    while start < len(jobs):
        start = _run_batch(jobs, start, timeout_s, outcomes, on_done, on_start if start == 0 else None,
                           child if start == 0 else None)
    return outcomes  # type: ignore[return-value]


def _done(job: Job) -> Optional[WorkerResult]:
    r = read_result(Path(job.out_dir))
    return r if r and r.phase == "done" else None


def _run_batch(jobs: list[Job], start: int, timeout_s: float, outcomes: list,
               on_done: Optional[Callable[[int], None]] = None,
               on_start: Optional[Callable[[], None]] = None,
               child: Optional[Child] = None) -> int:
    """Run jobs[start:] in one child (`child`, else a fresh one); fill outcomes; return the index to restart from."""
    child = child or Child()
    p = child.popen
    batch = jobs[start:]
    cur, timed_out = 0, False
    try:  # whatever happens here (Ctrl-C, SIGTERM, a timeout), `close` ends the child's whole session
        for j in batch:
            Path(j.out_dir).mkdir(parents=True, exist_ok=True)
        first = Path(batch[0].out_dir)
        (first / "jobs.json").write_text("[" + ",".join(j.model_dump_json() for j in batch) + "]")
        child.send(first / "jobs.json")
        t_job = time.perf_counter()
        if on_start:
            on_start()
        while p.poll() is None:
            time.sleep(0.02)
            while cur < len(batch) and _done(batch[cur]):
                cur, t_job = cur + 1, time.perf_counter()
                if on_done:
                    on_done(start + cur)  # jobs finished so far (progress only; results come at the end)
            if cur == len(batch):  # every result is written: its interpreter's exit (CUDA teardown) is nobody's wait
                kill_group(p)
                break
            if time.perf_counter() - t_job > timeout_s:
                timed_out = True
                kill_group(p)
                break
        rc = p.wait()
        wall = time.perf_counter() - child.started  # the child's life until its last result, start-up included
        tail = child.tail()
    finally:
        child.close()
    for i, j in enumerate(batch):
        res = _done(j)
        if res is not None:
            outcomes[start + i] = Outcome(res, rc, False, wall, tail)
            continue
        outcomes[start + i] = Outcome(read_result(Path(j.out_dir)), rc, timed_out, wall, tail)
        return start + i + 1
    return len(jobs)


def child_env() -> dict:
    """The environment of an evaluation child: this kopt first on PYTHONPATH, unbuffered output."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2]) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def kill_group(p: subprocess.Popen) -> None:
    """SIGKILL a child's whole process group (its own session: a candidate's helpers go too)."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        p.kill()


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
