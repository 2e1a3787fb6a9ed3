"""The evaluation child: `python -m kopt.eval.worker`, the path of jobs.json coming on its stdin.

It imports the candidate, runs it on fresh inputs, times it against the baseline (ABBA, rotated
inputs) and saves outputs for the parent to check. The fp32 reference and the baseline's outputs
never live in this process: the parent computes them after this process has exited.
"""

from __future__ import annotations

import gc

if __name__ == "__main__":  # the child itself (`python -m`), not a process importing its helpers (kopt.tune.worker)
    # No cyclic garbage collection while the start-up imports run (torch and tilelang make ~240,000 objects and
    # every collection walks them: torch + tilelang 2.43-3.05 -> 2.28-2.46 s on an H200 host with cached
    # bytecode, 1.8 -> 1.3 s on a CPU host); main() freezes what they made and turns it back on.
    gc.disable()

import sys  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

from kopt.eval.jobs import Job, WorkerResult, write_result  # noqa: E402
from kopt.eval.session import Reject, Session, check_tamper, classify, error_text, load, versions  # noqa: E402
from kopt.integrity import guards  # noqa: E402
from kopt.records import Status  # noqa: E402

#: Identity of the watched entry points before any candidate was imported in this process.
PRISTINE: dict | None = None
THREADS: set | None = None  # Python threads alive before any candidate was imported


class Evaluation:
    """One candidate on one case, phase by phase, in a Session; every phase updates result.json."""

    def __init__(self, job: Job):
        self.job = job
        self.out = Path(job.out_dir)
        self.res = WorkerResult()
        self.session: Session | None = None
        self.threads = THREADS or guards.thread_idents()  # the harness's own threads, before any candidate

    def save(self, phase: str | None = None) -> None:
        """Record progress so a crash still tells the parent how far we got."""
        if phase:
            self.res.phase = phase
        write_result(self.out, self.res)

    def run(self) -> None:
        """All phases in order."""
        t_start = guards.now()
        job = self.job

        self.res.overhead_s.update(START_S)  # the first job of this child only
        START_S.clear()

        from kopt import candidate
        from kopt.hardware import detect
        from kopt.workload import make_workload

        self.res.device_name = detect(job.device).name
        self.res.versions = versions()
        if job.device == "cpu":  # candidate and reference under one thread setting (kopt.timing.options.cpu_threads)
            from kopt.timing.options import pin_cpu_threads

            self.res.versions["cpu_threads"] = str(pin_cpu_threads())
        before = PRISTINE or guards.snapshot()
        self.save("import")
        t = guards.now()
        mod = load(Path(job.candidate_path))
        self.res.backend = candidate.backend_of(mod)
        self.res.overhead_s["import"] = guards.now() - t
        check_tamper(before, "import")
        s = self.session = Session(mod, job.device, self.out, job.config, self.threads, self.res.outputs)

        self.save("compile")
        t = guards.now()
        w0 = make_workload(job.case, job.seeds_correct[0], job.device)
        s.compile(w0)
        self.res.compile_s = guards.now() - t
        self.res.plan = s.plan_info(w0)

        self.save("correctness")
        t = guards.now()
        sets = {w0.seed: w0}
        for seed in job.seeds_correct:
            w = sets.get(seed) or make_workload(job.case, seed, job.device)
            s.checked_call(w, "correct")
            sets[seed] = w
        self.res.overhead_s["correctness"] = guards.now() - t
        check_tamper(before, "run")

        if job.do_timing:
            self.save("gate")
            wait_for_release(self.out, job.gate)
            self.save("timing")
            t = guards.now()
            timed = [sets.get(x) or make_workload(job.case, x, job.device) for x in job.seeds_timing]
            cuda = job.device.startswith("cuda")
            if cuda:
                from kopt.timing.cuda import PHASE_S
                from kopt.timing.cupti import CUPTI_START_S

                PHASE_S.update(dict.fromkeys(PHASE_S, 0.0))  # this job's timing loop only
            self.time(timed)
            self.res.overhead_s["timing"] = guards.now() - t
            side = self.res.timing.side_stream if self.res.timing and job.pair != "aa_base" else 0
            if side:  # seen in the device records: kernels on another stream, never joined to the caller's
                raise Reject(Status.side_stream, f"{side} timed calls left kernels on a stream other than the "
                             "caller's without making the caller's stream wait for them before run returned")
            if cuda:  # CUPTI's one-off start-up, and the timing loop's host parts
                if job.device in CUPTI_START_S:
                    self.res.overhead_s["cupti_start"] = CUPTI_START_S[job.device]
                self.res.overhead_s.update({f"timing_{k}": v for k, v in PHASE_S.items()})
            check_tamper(before, "timing saw")
            self.save("spot-check")
            for w in timed:  # outputs of timed inputs, checked by the parent like the others
                s.checked_call(w, "spot")
            if job.refill_seed is not None:  # same pointers, new contents: pointer-keyed caches fail
                fresh = make_workload(job.case, job.refill_seed, job.device)
                w = timed[0]
                for dst, src in zip(w.tensors, fresh.tensors):
                    dst.copy_(src)
                w.seed = job.refill_seed
                s.checked_call(w, "refill")
        # a patch that undoes itself when the timer reads it is left by the last call
        check_tamper(before, "spot checks left")
        self.res.overhead_s["worker_total"] = guards.now() - t_start
        self.res.status = Status.ok
        self.save("done")

    def time(self, timed) -> None:
        """ABBA timing of candidate against the baseline over rotated input sets."""
        from kopt import baselines
        from kopt.timing import Rotation, TimingOptions, rotating, time_fn, time_pair

        job = self.job
        opts = TimingOptions.for_device(job.device, quick=job.quick, cold=job.cold, graph=job.graph, flush=job.flush,
                                        replay=job.replay)

        call = self.session.timed()
        cand = rotating(call, timed)
        if job.peers:  # kopt peers: the candidate against each peer in turn
            from kopt.eval.peers import time_peers

            return time_peers(self.res, cand, timed, job, opts)
        base = baselines.pick(job.case, job.device, job.baseline)
        self.res.ref_name, self.res.ref_note = base.name, base.note
        try:
            first = base.bind(timed[0])  # prepared once (re-paging, planning), outside the timed calls
            first()
            guards.sync(job.device)
        except Exception as e:
            self.res.message = f"baseline {base.name} failed: {type(e).__name__}: {str(e)[:200]}"
            self.res.baseline_failed = True
            self.res.timing = time_fn(cand, job.device, opts)
            return
        calls = [first] + [base.bind(w) for w in timed[1:]]
        # ab: candidate vs baseline; A/A pairs time one function against itself (calibration).
        fn_a = Rotation(calls) if job.pair == "aa_base" else cand
        fn_b = rotating(call, timed) if job.pair == "aa_cand" else Rotation(calls)
        pair = time_pair(fn_a, fn_b, job.device, opts)
        self.res.timing, self.res.ref_timing = pair.a, pair.b
        self.res.ratios, self.res.speedup, self.res.speedup_ci = pair.ratios, pair.speedup, pair.ci


def wait_for_release(out: Path, gate: bool) -> None:
    """With `gate`, wait until the parent releases this job's timed calls (kopt.eval.jobs.GATE_FILE); exit when
    the parent is gone (this process was handed to another parent)."""
    import os
    import time

    from kopt.eval.jobs import GATE_FILE

    parent, t0 = os.getppid(), time.monotonic()
    while gate and not (out / GATE_FILE).exists():
        if os.getppid() != parent or time.monotonic() - t0 > 3600:  # nobody left to release it
            os._exit(3)
        time.sleep(0.005)


#: Start-up seconds of this child (reported in its first job's overhead_s): "child_warm" from the parent's
#: start of the process to the end of _warm, "child_wait" waiting for the jobs after that.
START_S: dict[str, float] = {}


def start_context():
    """Start creating the CUDA context of this process's first device in a thread, through the driver API
    (ctypes releases the GIL while the driver works, so the imports that follow run meanwhile). It retains
    the device's primary context, the one the CUDA runtime (torch) then finds ready. Returns the thread
    (join it before using the device); without a driver it does nothing, and torch reports what is wrong."""
    import threading

    def create():
        import ctypes

        from kopt.hardware import driver

        cuda, dev, ctx = driver(), ctypes.c_int(0), ctypes.c_void_p()
        if cuda is not None and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0:
            cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)

    t = threading.Thread(target=create, name="kopt-cuda-context", daemon=True)
    t.start()
    return t


def _warm() -> None:
    """Import what every evaluation needs (torch, the harness, the baseline library) and read the
    versions while the parent still prepares the jobs; as the parent asks ($KOPT_CHILD_WARM), create
    the CUDA context (in a thread, while the imports run: start_context) and import tilelang too. Library
    code only: no candidate code runs here, and PRISTINE and THREADS are still taken after the wait,
    before any candidate import."""
    import os

    from kopt.eval.jobs import ENV_WARM

    want = set(filter(None, os.environ.get(ENV_WARM, "").split(",")))
    ctx = start_context() if "cuda" in want else None

    import torch
    import torch.profiler  # noqa: F401

    from kopt import baselines, candidate, hardware, timing, workload  # noqa: F401

    versions()
    if ctx is not None:
        ctx.join()
    if "cuda" in want and torch.cuda.is_available():
        try:
            torch.cuda.mem_get_info()  # the runtime's view of the context (torch.cuda.init() alone makes none)
        except Exception:  # a broken device: the job's own phases report it
            pass
    if "tilelang" in want:
        try:
            import tilelang  # noqa: F401
        except Exception:  # not installed or broken: the candidate's import reports it
            pass


def _since_parent_start() -> float | None:
    import os
    import time

    from kopt.eval.jobs import ENV_T0

    try:
        return time.time() - float(os.environ[ENV_T0])
    except (KeyError, ValueError):
        return None


def main() -> int:
    """Entry point of the child process: warm up, wait for the path of jobs.json (one line on stdin),
    evaluate each of its jobs in order. End of file instead means the parent gave up: exit."""
    import json

    global PRISTINE, THREADS
    import time

    _warm()
    # what the imports made lives as long as the process: out of every later collection's walk (the timing
    # loop's record reading collects often); collection back on before any candidate code runs
    gc.freeze()
    gc.enable()
    warm_s, t = _since_parent_start(), time.perf_counter()
    line = sys.stdin.readline().strip()
    if not line:
        return 0
    if warm_s is not None:
        START_S.update(child_warm=warm_s, child_wait=time.perf_counter() - t)
    jobs = [Job.model_validate(j) for j in json.loads(Path(line).read_text())]
    PRISTINE = guards.snapshot()  # before any candidate is imported: later jobs compare against this
    THREADS = guards.thread_idents()
    for job in jobs:
        _evaluate(job)
    return 0


def run_to_result(ev, device: str) -> None:
    """Run an evaluation (`.run()`, `.res`, `.save()`); every failure still ends as a saved result."""
    try:
        if device == "cuda":
            import torch

            torch.cuda.init()
        ev.run()
    except Reject as r:
        ev.res.status, ev.res.message = r.status, str(r)
        ev.save("done")
    except Exception as e:  # a harness bug or a candidate escaping `call`: still a result, never silence
        ev.res.status = classify(e)
        ev.res.message = error_text(e)
        traceback.print_exc()
        ev.save("done")


def _evaluate(job: Job) -> None:
    ev = Evaluation(job)
    try:
        run_to_result(ev, job.device)
    finally:
        if ev.session:  # the earlier outputs it kept alive (a reused buffer shows) go with the job
            ev.session.held.clear()
        if job.device == "cuda":
            import torch

            torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
