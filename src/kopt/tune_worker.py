"""The tuning child: `python -m kopt.tune_worker job.json`.

One child evaluates many configs of one case, so the candidate is imported (and the device set up)
once: for each config it compiles (prepare + first call), runs the correctness calls through the
bench worker's guarded `checked_call` (outputs saved for the parent, which holds the fp32
reference), times cold (flushed L2) and, on CUDA, hot (graph replay), and spot-checks the timed
inputs. result.json is rewritten after every config, so a crash or a timeout still leaves the
finished configs and names the one in progress. With `prewarm` set the child only compiles its
configs (filling TileLang's disk cache for the timing child) and saves nothing else.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, Field

from kopt.cases import Case
from kopt.isolate import SavedOutput, write_result
from kopt.results import Status, TimingStats, Validation


class TuneJob(BaseModel):
    """One shard of one case's config list, written as job.json."""

    candidate_path: str
    case: Case
    device: str
    shard: int = Field(0, ge=0)
    shards: int = Field(1, ge=1)
    max_configs: Optional[int] = Field(None, ge=1)
    indices: Optional[list[int]] = None
    """Config indices to run (a rerun after a crash); None: this shard's share of the selection."""
    seeds_correct: list[int]
    seeds_timing: list[int]
    quick: bool = False
    hot: bool = True
    baseline: str = "auto"
    prewarm: bool = False
    part: int = Field(0, ge=0)
    parts: int = Field(1, ge=1)
    """With prewarm: this child compiles every parts-th config of the shard, starting at part."""
    out_dir: str


class ConfigResult(BaseModel):
    """One config of one case: compile time, cold and hot timing, saved outputs, verdict."""

    index: int
    config: Optional[dict] = None
    shard: int = 0
    status: Optional[Status] = None
    message: str = ""
    compile_s: Optional[float] = None
    cold: Optional[TimingStats] = None
    hot: Optional[TimingStats] = None
    outputs: list[SavedOutput] = Field(default_factory=list)
    dir: str = ""
    correct: Optional[bool] = None
    """Set by the parent once the outputs were checked against the reference."""
    validation: Optional[Validation] = None


class ShardResult(BaseModel):
    """What a tuning child reports (rewritten after every config)."""

    phase: str = "start"
    status: Optional[Status] = None
    message: str = ""
    backend: str = "NA"
    device_name: str = "NA"
    units: int = 0
    n_configs: int = 0
    """len(configs(case)) before --max-configs."""
    selected: list[int] = Field(default_factory=list)
    indices: list[int] = Field(default_factory=list)
    current: Optional[int] = None
    """The config in progress: the one to blame when the child dies."""
    current_config: Optional[dict] = None
    hot_error: Optional[str] = None
    """Why hot (graph) timing was switched off in this child; reruns then skip it."""
    results: list[ConfigResult] = Field(default_factory=list)
    ref_name: str = "NA"
    ref_cold: Optional[TimingStats] = None
    versions: dict[str, str] = Field(default_factory=dict)
    overhead_s: dict[str, float] = Field(default_factory=dict)
    wall_s: float = 0.0
    """Set by the parent: wall time of this shard, children and checks included."""


def select_indices(n: int, max_configs: Optional[int]) -> list[int]:
    """Config indices to try: all, or the default (0) plus K-1 others spread evenly over the rest."""
    if n <= 0:
        return []
    if not max_configs or max_configs >= n:
        return list(range(n))
    if max_configs == 1:
        return [0]
    rest, k = n - 1, max_configs - 1
    picks = sorted({1 + round(j * (rest - 1) / max(k - 1, 1)) for j in range(k)}) if k > 1 else [1]
    return [0] + picks


def shard_indices(selected: list[int], shard: int, shards: int) -> list[int]:
    """This shard's configs: the default (so each child times its own reference) plus every shards-th other."""
    if not selected:
        return []
    return [selected[0]] + selected[1:][shard::shards]


def _status_of(e: BaseException) -> Status:
    from kopt.worker import _classify

    return _classify(e)


class TuneRun:
    """The child's work: load once, then each config in turn."""

    def __init__(self, job: TuneJob):
        from kopt import guards

        self.job, self.out = job, Path(job.out_dir)
        self.res = ShardResult()
        self.threads = guards.thread_idents()  # the harness's own threads, before the candidate runs

    def save(self, phase: Optional[str] = None) -> None:
        """Record progress (atomic write of result.json)."""
        if phase:
            self.res.phase = phase
        write_result(self.out, self.res)

    def run(self) -> None:
        """Load, enumerate, then compile / check / time every config of this shard."""
        from kopt import candidate, guards
        from kopt.hardware import detect
        from kopt.worker import Reject, _versions
        from kopt.workload import make_workload

        job = self.job
        info = detect(job.device)
        self.res.device_name, self.res.units = info.name, int(info.units or 0)
        self.res.versions = _versions()
        before = guards.snapshot()
        self.save("import")
        try:
            mod = candidate.load(Path(job.candidate_path))
        except Exception as e:
            raise Reject(Status.compile_error, str(e)) from None
        self.res.backend = candidate.backend_of(mod)
        if guards.changed(before):
            raise Reject(Status.tampered, f"import patched {', '.join(guards.changed(before))}")
        cfgs = self.configs(mod)
        self.res.n_configs = len(cfgs)
        self.res.selected = select_indices(len(cfgs), job.max_configs)
        self.res.indices = job.indices if job.indices is not None else shard_indices(
            self.res.selected, job.shard, job.shards)
        self.save("prewarm" if job.prewarm else "inputs")
        seeds = job.seeds_correct[:1] if job.prewarm else list(dict.fromkeys(job.seeds_correct + job.seeds_timing))
        sets = {s: make_workload(job.case, s, job.device) for s in seeds}
        if job.prewarm:
            for i in self.res.indices[job.part::job.parts]:
                self.res.current = i
                self.compile(mod, cfgs[i], sets[job.seeds_correct[0]], ConfigResult(index=i))
            self.res.current, self.res.status = None, Status.ok
            self.save("done")
            return
        self.time_baseline([sets[s] for s in job.seeds_timing])
        for i in self.res.indices:
            cr = ConfigResult(index=i, config=cfgs[i], shard=job.shard, dir=f"cfg{i}")
            self.res.current, self.res.current_config = i, cfgs[i]
            self.save("configs")
            self.one(mod, cr, sets, before)
            self.res.results.append(cr)
            self.save()
            if cr.status in (Status.crash, Status.tampered) or self.res.hot_error:
                break            # a broken context or process (or a failed capture): a fresh child runs the rest
        self.res.current, self.res.current_config, self.res.status = None, None, Status.ok
        self.save("done")

    def configs(self, mod) -> list[Optional[dict]]:
        """The candidate's config list for this case; the first entry is its default."""
        from kopt import candidate
        from kopt.worker import Reject

        fn = getattr(mod, "configs", None)
        if not callable(fn):
            raise Reject(Status.unsupported, "the candidate declares no configs(case): nothing to tune")
        if not candidate.accepts_config(mod):
            raise Reject(Status.unsupported, "run() takes no config= keyword: nothing to tune")
        try:
            cfgs = list(fn(self.job.case.shape_dict()))
        except Exception as e:
            raise Reject(Status.runtime_error, f"configs() raised {type(e).__name__}: {str(e)[:300]}") from None
        bad = [c for c in cfgs if c is not None and not isinstance(c, dict)]
        if not cfgs or bad:
            raise Reject(Status.unsupported, "configs() must return a non-empty list of dicts")
        return cfgs

    def compile(self, mod, cfg, w, cr: ConfigResult) -> Optional[object]:
        """prepare (when declared) and the first call; returns that output (kept: a reused buffer is stale)."""
        from kopt import guards

        kw = w.kwargs(cfg)
        t = guards.now()
        prep = getattr(mod, "prepare", None)
        try:
            if callable(prep):
                prep(*w.args(), **kw)
            out = mod.run(*w.args(), **kw)
            guards.sync(self.job.device)
        except Exception as e:
            cr.status = Status.unsupported if isinstance(e, ValueError) else _status_of(e)
            cr.message = f"compile/first call raised {type(e).__name__}: {str(e)[:300]}"
            return None
        cr.compile_s = guards.now() - t
        return out

    def one(self, mod, cr: ConfigResult, sets: dict, before: dict) -> None:
        """Compile, check, time (cold, then hot) and spot-check one config."""
        from kopt import guards
        from kopt.isolate import Job
        from kopt.worker import Evaluation, Reject

        job = self.job
        d = self.out / cr.dir
        d.mkdir(parents=True, exist_ok=True)
        ev = Evaluation(Job(candidate_path=job.candidate_path, case=job.case, device=job.device,
                            seeds_correct=job.seeds_correct, seeds_timing=job.seeds_timing,
                            config=cr.config, out_dir=str(d)))
        ev.mod, ev.threads = mod, self.threads
        first = self.compile(mod, cr.config, sets[job.seeds_correct[0]], cr)
        if cr.status is not None:
            return
        if hasattr(first, "data_ptr"):
            ev.held.append(first)              # returning this same buffer again would be stale
        try:
            for s in job.seeds_correct:
                ev.checked_call(sets[s], "correct")
            timed = [sets[s] for s in job.seeds_timing]
            cr.cold = self.time(lambda w: ev.call(w, poison=False), timed, hot=False)
            for w in timed:
                ev.checked_call(w, "spot")
            if guards.changed(before):
                raise Reject(Status.tampered, f"run patched {', '.join(guards.changed(before))}")
            cr.status = Status.ok
            # Hot last: a failed graph capture can leave the context unusable, and the config's
            # verdict and cold time are already in hand.
            if job.hot and job.device != "cpu" and self.res.hot_error is None:
                try:
                    cr.hot = self.time(lambda w: ev.call(w, poison=False), timed, hot=True)
                except Exception as e:  # not capturable (host sync in run, legacy stream, ...)
                    self.res.hot_error = f"{type(e).__name__}: {str(e)[:200]}"
                    print(f"hot timing disabled: {self.res.hot_error}", file=sys.stderr)
        except Reject as r:
            cr.status, cr.message = r.status, str(r)
        except Exception as e:
            cr.status, cr.message = _status_of(e), f"{type(e).__name__}: {str(e)[:300]}"
        cr.outputs = list(ev.res.outputs)

    def time(self, call, timed, hot: bool) -> TimingStats:
        """Cold timing (flushed L2: the winner's criterion) or hot timing (CUDA-graph replay) of one config."""
        from kopt.timing import TimingOptions, rotating, time_fn

        opts = TimingOptions.for_device(self.job.device, quick=self.job.quick, cold=not hot, graph=hot)
        return time_fn(rotating(call, timed), self.job.device, opts)

    def time_baseline(self, timed) -> None:
        """Cold time of the baseline on the same inputs, once per child (for the reported speedup)."""
        from kopt import baselines, guards
        from kopt.timing import TimingOptions, rotating, time_fn

        base = baselines.pick(self.job.case, self.job.device, self.job.baseline)
        self.res.ref_name = base.name
        opts = TimingOptions.for_device(self.job.device, quick=self.job.quick, cold=True, graph=False)
        fn = rotating(base.fn, timed)

        try:
            fn()
            guards.sync(self.job.device)
            self.res.ref_cold = time_fn(fn, self.job.device, opts)
        except Exception as e:
            self.res.message = f"baseline {base.name} failed: {type(e).__name__}: {str(e)[:200]}"


def main(argv: list[str]) -> int:
    """Entry point of the tuning child."""
    from kopt.worker import run_to_result

    job = TuneJob.model_validate_json(Path(argv[1]).read_text())
    run_to_result(TuneRun(job), job.device)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
