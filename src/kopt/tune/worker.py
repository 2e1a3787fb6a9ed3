"""The tuning child: `python -m kopt.tune.worker job.json`.

One child evaluates many configs of one case in two stages, so the candidate is imported (and the
device set up) once:

1. Screen: each config is compiled (prepare + first call), correctness-called through the bench
   candidate session's guarded `checked_call` (kopt.eval.session; outputs saved for the parent, which holds the fp32
   reference),
   timed cold with the quick timing options (and, on CUDA, hot by graph replay), and spot-checked
   on the timed inputs.
2. Finalists: the `finalists` configs with the fastest screened cold medians (default excluded)
   are each timed against the default in interleaved ABBA rounds (`time_pair`, full options
   unless `quick`), in this same process, so the paired speedup compares two kernels measured
   side by side. A config screened by an earlier child of the shard (`prior`) is compiled again.

result.json is rewritten after every config and every finalist, so a crash or a timeout still
leaves the finished work and names the config in progress. With `prewarm` set the child only
compiles its configs (filling TileLang's disk cache for the timing child) and saves nothing else.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from kopt.eval.jobs import write_result
from kopt.eval.session import Reject, Session, check_tamper, classify, error_text, load, versions
from kopt.records import Status, TimingStats
from kopt.tune.models import ConfigResult, ShardResult, TuneJob
from kopt.tune.pick import pick_finalists, select_indices, shard_indices


class TuneRun:
    """The child's work: load once, screen each config in turn, then pair the finalists with the default."""

    def __init__(self, job: TuneJob):
        from kopt.integrity import guards

        self.job, self.out = job, Path(job.out_dir)
        self.res = ShardResult(results=list(job.prior))
        self.threads = guards.thread_idents()  # the harness's own threads, before the candidate runs
        self.sessions: dict[int, Session] = {}   # index -> session of a config screened ok here (finalists' calls)

    def save(self, phase: Optional[str] = None) -> None:
        """Record progress (atomic write of result.json)."""
        if phase:
            self.res.phase = phase
        write_result(self.out, self.res)

    def run(self) -> None:
        """Load, enumerate, screen (compile / check / quick-time) this child's configs, then pair the finalists."""
        from kopt import candidate
        from kopt.hardware import detect
        from kopt.integrity import guards
        from kopt.workload import make_workload

        job = self.job
        info = detect(job.device)
        self.res.device_name, self.res.units = info.name, int(info.units or 0)
        self.res.versions = versions()
        if job.device == "cpu":  # the same thread setting as every CPU bench (kopt.timing.options.cpu_threads)
            from kopt.timing.options import pin_cpu_threads

            self.res.versions["cpu_threads"] = str(pin_cpu_threads())
        before = guards.snapshot()
        self.save("import")
        mod = load(Path(job.candidate_path))
        self.res.backend = candidate.backend_of(mod)
        check_tamper(before, "import")
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
                self.compile(self.session(mod, cfgs[i], self.out), sets[job.seeds_correct[0]], ConfigResult(index=i))
            self.res.current, self.res.status = None, Status.ok
            self.save("done")
            return
        if not job.prewarm and (why := one_plan(mod, [cfgs[i] for i in self.res.selected],
                                                 sets[job.seeds_correct[0]], job.device, bool(job.configs))):
            self.res.not_applicable, self.res.status = why, Status.ok
            self.save("done")
            return
        if job.indices is None:  # the first child only: the parent takes the baseline from it, not from a
            self.time_baseline([sets[s] for s in job.seeds_timing])  # rerun or the finalists' child
        if self.screen(mod, cfgs, sets, before):
            self.pair_finalists(mod, cfgs, sets, before)
        self.res.current, self.res.current_config, self.res.status = None, None, Status.ok
        self.save("done")

    def screen(self, mod, cfgs: list, sets: dict, before: dict) -> bool:
        """Stage 1 over this child's configs; False when it stopped early (a fresh child runs the rest)."""
        for i in self.res.indices:
            cr = ConfigResult(index=i, config=cfgs[i], shard=self.job.shard, dir=f"cfg{i}")
            self.res.current, self.res.current_config = i, cfgs[i]
            self.save("configs")
            self.one(mod, cr, sets, before)
            self.res.results.append(cr)
            self.save()
            if cr.status in (Status.crash, Status.tampered) or self.res.hot_error:
                return False     # a broken context or process (or a failed capture)
        return True

    def configs(self, mod) -> list[Optional[dict]]:
        """The candidate's config list for this case; the first entry is its default. With --config (job.configs):
        that default (configs(case)'s first entry; none where the candidate declares no configs) and the given
        ones."""
        from kopt import candidate

        fn = getattr(mod, "configs", None)
        if not callable(fn) and not self.job.configs:
            raise Reject(Status.unsupported, "the candidate declares no configs(case): nothing to tune")
        if not candidate.accepts_config(mod):
            raise Reject(Status.unsupported, "run() takes no config= keyword: nothing to tune")
        if not callable(fn):
            return [None, *self.job.configs]
        try:
            cfgs = list(fn({**self.job.case.shape_dict(), "device": "cpu" if self.job.device == "cpu" else "cuda"}))
        except Exception as e:
            raise Reject(Status.runtime_error, f"configs() raised {error_text(e)}") from None
        bad = [c for c in cfgs if c is not None and not isinstance(c, dict)]
        if not cfgs or bad:
            raise Reject(Status.unsupported, "configs() must return a non-empty list of dicts")
        return [cfgs[0], *self.job.configs] if self.job.configs else cfgs

    def compile(self, s: Session, w, cr: ConfigResult) -> Optional[object]:
        """prepare (when declared) and the first call, unpoisoned; returns that output (held by the session:
        a reused buffer is stale), or None with the config's status and message set."""
        from kopt.integrity import guards

        t = guards.now()
        try:
            out = s.compile(w, poison=False)
        except Reject as r:
            e = r.error
            cr.status = r.status
            cr.message = f"compile/first call raised {error_text(e) if e else r}"
            return None
        except Exception as e:  # the device failing under it (its sync)
            cr.status, cr.message = classify(e), f"compile/first call raised {error_text(e)}"
            return None
        cr.compile_s = guards.now() - t
        return out

    def session(self, mod, config: Optional[dict], d: Path) -> Session:
        """A session of one config: the guarded call path of every bench, outputs saved under d."""
        d.mkdir(parents=True, exist_ok=True)
        return Session(mod, self.job.device, d, config, self.threads)

    def one(self, mod, cr: ConfigResult, sets: dict, before: dict) -> None:
        """Compile, check, time (cold, then hot) and spot-check one config."""
        job = self.job
        s = self.session(mod, cr.config, self.out / cr.dir)
        self.compile(s, sets[job.seeds_correct[0]], cr)
        if cr.status is not None:
            return
        try:
            for x in job.seeds_correct:
                s.checked_call(sets[x], "correct")
            timed = [sets[x] for x in job.seeds_timing]
            cr.cold = self.time(s.timed(), timed, hot=False)
            for w in timed:
                s.checked_call(w, "spot")
            check_tamper(before, "run")
            cr.status = Status.ok
            self.sessions[cr.index] = s
            # Hot last: a failed graph capture can leave the context unusable, and the config's
            # verdict and cold time are already in hand.
            if job.hot and job.device != "cpu" and self.res.hot_error is None:
                try:
                    cr.hot = self.time(s.timed(), timed, hot=True)
                except Exception as e:  # not capturable (host sync in run, legacy stream, ...)
                    self.res.hot_error = f"{type(e).__name__}: {str(e)[:200]}"
                    print(f"hot timing disabled: {self.res.hot_error}", file=sys.stderr)
        except Reject as r:
            cr.status, cr.message = r.status, str(r)
        except Exception as e:
            cr.status, cr.message = classify(e), error_text(e)
        cr.outputs = list(s.outputs)
        s.held.clear()          # only checked calls compare with earlier outputs; the finalists' calls are timed

    def time(self, call, timed, hot: bool) -> TimingStats:
        """Screen timing of one config, always with the quick options: cold (flushed L2) or hot (graph replay)."""
        from kopt.timing import TimingOptions, rotating, time_fn

        opts = TimingOptions.for_device(self.job.device, quick=True, cold=not hot, graph=hot,
                                        eager_calls=EAGER_CALLS)
        return time_fn(rotating(call, timed), self.job.device, opts)

    def pair_finalists(self, mod, cfgs: list, sets: dict, before: dict) -> None:
        """Stage 2: ABBA rounds of each finalist (a) against the default (b); result.json after each."""
        from kopt.timing import TimingOptions, rotating, time_pair

        job = self.job
        self.res.finalists = pick_finalists(self.res.results, job.finalists)
        self.save("finalists")
        if not self.res.finalists:
            return
        by_index = {r.index: r for r in self.res.results}
        timed = [sets[s] for s in job.seeds_timing]
        opts = TimingOptions.for_device(job.device, quick=job.quick, cold=True, graph=False, eager_calls=EAGER_CALLS)
        try:
            default = rotating(self.caller(mod, cfgs, 0, sets), timed)
            for i in self.res.finalists:
                cr = by_index[i]
                self.res.current, self.res.current_config = i, cr.config
                self.save()
                pair = time_pair(rotating(self.caller(mod, cfgs, i, sets), timed), default, job.device, opts)
                try:
                    check_tamper(before, "run")
                except Reject as r:
                    cr.status, cr.message = r.status, str(r)
                    raise RuntimeError(f"config {i}: {cr.message}") from None
                cr.paired_speedup, cr.paired_ci, cr.paired_a, cr.paired_b = pair.speedup, pair.ci, pair.a, pair.b
                self.save()
        except Exception as e:  # the screen's verdicts stand; pick_winner uses the pairs that finished
            self.res.pair_error = error_text(e)
            print(f"finalist stage stopped: {self.res.pair_error}", file=sys.stderr)

    def caller(self, mod, cfgs: list, i: int, sets: dict):
        """A timed call (w -> output) of config i; compiled here first when an earlier child screened it."""
        s = self.sessions.get(i)
        if s is None:
            cr = ConfigResult(index=i)
            s = self.session(mod, cfgs[i], self.out / f"cfg{i}")
            self.compile(s, sets[self.job.seeds_correct[0]], cr)
            if cr.status is not None:
                raise RuntimeError(f"config {i} no longer compiles: {cr.message}")
            s.held.clear()
            self.sessions[i] = s
        return s.timed()

    def time_baseline(self, timed) -> None:
        """Cold time of the baseline on the same inputs, once per child (for the reported speedup)."""
        from kopt import baselines
        from kopt.integrity import guards
        from kopt.timing import TimingOptions, rotating, time_fn

        base = baselines.pick(self.job.case, self.job.device, self.job.baseline)
        self.res.ref_name = base.name
        opts = TimingOptions.for_device(self.job.device, quick=self.job.quick, cold=True, graph=False,
                                        eager_calls=EAGER_CALLS)
        fn = rotating(base.fn, timed)

        try:
            fn()
            guards.sync(self.job.device)
            self.res.ref_cold = time_fn(fn, self.job.device, opts)
        except Exception as e:
            self.res.message = f"baseline {base.name} failed: {type(e).__name__}: {str(e)[:200]}"


def one_plan(mod, cfgs: list, w, device: str, given: bool = False) -> str:
    """On the CPU: why the search does not apply when every config reports the same plan (`plan_info`), e.g. GPU
    switches a C kernel ignores; "" when the configs differ there, the candidate has no plan_info, or it fails
    (the screen then reports it). Not asked on a GPU, where plan_info compiles the config's kernels."""
    import json

    fn = getattr(mod, "plan_info", None)
    if device != "cpu" or len(cfgs) < 2 or not callable(fn):
        return ""
    try:
        plans = {json.dumps(fn(w.q, w.k_cache, w.v_cache, w.cache_seqlens, w.block_table, w.softmax_scale, config=c),
                            sort_keys=True, default=str) for c in cfgs}
    except Exception:  # a config plan_info refuses: the screen runs and reports it  # noqa: BLE001
        return ""
    if len(plans) > 1:
        return ""
    whose = "the default and --config's" if given else "configs(case)"
    return (f"all {len(cfgs)} configs of {whose} run one plan on the cpu (plan_info {plans.pop()}): nothing to "
            "tune here; configs(case) gets case['device'] and may list the CPU kernel's own switches")


#: Tuning ranks configs by device-only time alone: the host-inclusive second figure (extra flushed,
#: synchronized calls per timing) is not taken for every config of a screen.
EAGER_CALLS = 0


def main(argv: list[str]) -> int:
    """Entry point of the tuning child."""
    from kopt.eval.worker import run_to_result

    job = TuneJob.model_validate_json(Path(argv[1]).read_text())
    run_to_result(TuneRun(job), job.device)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

