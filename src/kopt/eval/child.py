"""Run evaluation jobs in child processes (`python -m kopt.eval.worker`) with a wall-clock limit per job;
survive whatever a child does (kopt.proc starts, kills and reaps them)."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Optional

from kopt import proc
from kopt.eval import warm as kept_children
from kopt.eval.jobs import ENV_WARM, GATE_FILE, Job, Outcome, WorkerResult, read_result


class Child:
    """One evaluation child (`python -m kopt.eval.worker`, in its own session), started before its jobs exist
    (or, with take_kept, the one a previous run's supervisor started: kopt.eval.warm).

    It imports torch and the harness (and, as `warm` asks, creates its CUDA context and imports
    tilelang: library code only, never the candidate's), then waits for the path of jobs.json on its
    stdin: started first thing, its interpreter start and `import torch` (seconds on some hosts)
    overlap the parent's own preparation. Its output goes to child.log in a folder of its own (the
    jobs' folders do not exist yet). A parent that never sends jobs ends it with `close`; one that dies
    closes the pipe, and the child, reading end of file, exits.
    """

    def __init__(self, warm: tuple[str, ...] = (), take_kept: bool = False):
        """take_kept: take the child a supervisor kept for this environment (kopt.eval.warm) when there is one."""
        self.started = time.perf_counter()
        self.env = proc.child_env()
        self.env[ENV_WARM] = ",".join(warm)
        kept = kept_children.take(self.env) if take_kept and kept_children.enabled() else None
        self.kept = kept is not None
        """True: started before this run, by the supervisor of the previous one (its start-up cost this run nothing)."""
        if kept is not None:
            self.popen, self.log, self.dir = kept, kept.log, kept.log.parent
            return
        self.popen, self.log, _ = kept_children.spawn_worker(self.env)
        self.dir = self.log.parent

    def claim(self) -> Child:
        """Count the child's wall (`child_wall`) from now: a child started ahead of its evaluation (a Verdict's,
        before its compiles) is claimed by the evaluation that uses it, its start-up having run beside other work."""
        self.started = time.perf_counter()
        return self

    def keep(self, seconds: float) -> None:
        """Start a supervisor that keeps a started child of this environment for the next run, `seconds`
        (kopt.eval.warm); called right after this one started, its child warms up beside this one. Nothing when
        seconds is 0 or this child was itself a kept one (its supervisor is already starting the next)."""
        if seconds > 0 and not self.kept:
            kept_children.keep(self.env, seconds)

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
        if self.kept:  # its supervisor is its parent: kill its group, read its code from the supervisor
            if self.popen.poll() is None:
                self.popen.kill()
                try:
                    self.popen.wait(timeout=10)
                except subprocess.TimeoutExpired:  # a supervisor that does not answer: nothing left to wait for
                    pass
        else:
            proc.kill(self.popen)
        self.popen.stdin.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def run_jobs(jobs: list[Job], timeout_s: float,
             on_done: Optional[Callable[[int], None]] = None,
             on_start: Optional[Callable[[], None]] = None,
             child: Optional[Child] = None,
             on_outcome: Optional[Callable[[int, Outcome], None]] = None,
             ready: Optional[Callable[[], bool]] = None,
             deadline: Optional[float] = None) -> list[Optional[Outcome]]:
    """Evaluate jobs in as few children as possible, each job within `timeout_s`.

    One child runs the jobs in order (imports and compile caches are paid once): `child` when the
    caller started one early, else a fresh one. When a job kills or hangs its child, that job gets
    the failure and the jobs after it run in a fresh child. `on_start` is called once, right after
    the first child was given its jobs (work to overlap with it). Each child is closed when its
    batch ends.

    `on_outcome(i, outcome)` is called as soon as job i has its outcome, while the child goes on (the
    caller checks its outputs and prints its line then, not after the last job). A job with `gate` set
    waits, before its timed calls, for its release (`jobs.GATE_FILE` in its folder): the next job is
    released only once `on_outcome` of the one before has returned (and, for the first, once `ready()`
    is true), so no work of this process runs beside a timing. `deadline` (a perf_counter time): no job
    is released after it, and the job running at it is stopped; jobs not run have no outcome (None).
    """
    outcomes: list[Optional[Outcome]] = [None] * len(jobs)
    start = 0
    while start < len(jobs):
        start = _run_batch(jobs, start, timeout_s, outcomes, on_done, on_start if start == 0 else None,
                           child if start == 0 else None, on_outcome, ready, deadline)
    return outcomes


def _done(job: Job) -> Optional[WorkerResult]:
    r = read_result(Path(job.out_dir))
    return r if r and r.phase == "done" else None


def over(deadline: Optional[float]) -> bool:
    """Whether a perf_counter deadline (None: none) has passed."""
    return deadline is not None and time.perf_counter() >= deadline


def _run_batch(jobs: list[Job], start: int, timeout_s: float, outcomes: list,
               on_done: Optional[Callable[[int], None]] = None,
               on_start: Optional[Callable[[], None]] = None,
               child: Optional[Child] = None,
               on_outcome: Optional[Callable[[int, Outcome], None]] = None,
               ready: Optional[Callable[[], bool]] = None,
               deadline: Optional[float] = None) -> int:
    """Run jobs[start:] in one child (`child`, else a fresh one); fill outcomes; return the index to restart from
    (len(jobs) when done or stopped by the deadline)."""
    child = child or Child()
    p = child.popen
    batch = jobs[start:]
    cur, timed_out, stopped, released = 0, False, False, -1

    def finish(i: int, oc: Outcome) -> None:
        outcomes[start + i] = oc
        if on_outcome:
            on_outcome(start + i, oc)
        if on_done:
            on_done(start + i + 1)  # jobs finished so far

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
            while cur < len(batch) and (res := _done(batch[cur])):
                finish(cur, Outcome(res, None, False, time.perf_counter() - child.started, ""))
                cur, t_job = cur + 1, time.perf_counter()
            if cur == len(batch):  # every result is written: its interpreter's exit (CUDA teardown) is nobody's wait
                proc.kill_group(p)
                break
            if over(deadline):  # the budget is spent: the job in progress and the rest are not run
                stopped = True
                proc.kill_group(p)
                break
            if released < cur and (cur > 0 or ready is None or ready()):
                (Path(batch[cur].out_dir) / GATE_FILE).touch()  # its timed calls may start
                released, t_job = cur, time.perf_counter()
            if time.perf_counter() - t_job > timeout_s:
                timed_out = True
                proc.kill_group(p)
                break
        rc = p.wait()
        wall = time.perf_counter() - child.started  # the child's life until its last result, start-up included
        tail = child.tail()
    finally:
        child.close()
    for oc in outcomes[start:start + cur]:  # given out while the child still ran: how it ended
        oc.returncode, oc.stderr_tail = rc, tail
    while cur < len(batch) and (res := _done(batch[cur])):  # written just before it exited
        finish(cur, Outcome(res, rc, False, wall, tail))
        cur += 1
    if cur == len(batch) or stopped:
        return len(jobs)
    finish(cur, Outcome(read_result(Path(batch[cur].out_dir)), rc, timed_out, wall, tail))
    return start + cur + 1
