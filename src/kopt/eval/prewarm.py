"""Compile a GPU run's kernels ahead of it, in parallel: the distinct kernels of a list of shapes (through the
candidate's `device_plan(shape, device profile, config)` hook, deduplicated before anything compiles) built by its
`prepare(...)` in worker processes, one CUDA context each, into TileLang's disk cache. The run that follows loads
them (0.1-0.3 s each) instead of compiling one after the other (about 10 s each on an H200 host).

`kopt verify` on a CUDA device warms its rows so before the first one runs, and `kopt peers` the kernels of both
sides of an A/B (`warm_each`); `kopt lab prewarm` plans larger sets (every bench variant, tuning configs, screens).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

#: device_plan fields that do not select a kernel: the device's facts, and the split count (a kernel depends on
#: whether a plan splits, not on how many ways: `split` stands for it in the key).
NOT_KERNEL = frozenset({"num_splits", "device", "backend", "arch", "units", "warp_size", "smem_per_unit",
                        "l2_bytes", "smem_bytes"})


@dataclass(frozen=True)
class Kernel:
    """One distinct kernel build: the key that selects it, the shape and config that resolve to it (prepared to
    compile it), or the reason its plan failed."""

    key: tuple
    case: object
    config: Optional[dict]
    error: Optional[str] = None

    @property
    def label(self) -> str:
        """The key as `field=value` words (what --list prints)."""
        return " ".join(f"{k}={v}" for k, v in self.key)


def kernel_key(case, plan: dict) -> tuple:
    """What selects a compiled kernel: the call's dtype and heads, and every plan field but NOT_KERNEL."""
    v = case.variant
    fields = {k: tuple(x) if isinstance(x, list) else x for k, x in plan.items() if k not in NOT_KERNEL}
    fields["split"] = int(plan.get("num_splits") or 1) > 1
    return (("dtype", v.dtype.value), ("hq", case.q_heads), ("hkv", case.kv_heads), ("d", v.head_dim),
            *sorted(fields.items()))


def distinct(mod, items: list, profile: dict) -> list[Kernel]:
    """The distinct kernels of `items`, (case, config) pairs (config None: the candidate's own plan), on the device of
    `profile`; a pair whose plan raises is a Kernel with its error (its build would fail too)."""
    seen: dict[tuple, Kernel] = {}
    for case, config in items:
        try:
            k = Kernel(kernel_key(case, mod.device_plan(case.shape_dict(), profile, config)), case, config)
        except ValueError as e:  # a config this shape or device cannot run
            k = Kernel((("case", case.id), ("variant", case.variant.label()), ("config", str(config))), case, config,
                       str(e))
        seen.setdefault(k.key, k)
    return list(seen.values())


def device_profile(name: Optional[str] = None) -> dict:
    """The hardware.yaml profile the plans are resolved for: `name`'s, else the one matching this host's CUDA device.
    An unknown name, or a device no profile matches, is a usage error."""
    from kopt import hardware
    from kopt.errors import UsageError

    if name is None:
        import torch

        raw = torch.cuda.get_device_name()
        prof = hardware.match_profile(raw)
        if prof is None:
            raise UsageError(f"no hardware.yaml profile matches this device ({raw}): add one, or give --device-profile")
    else:
        prof = hardware.profile(name)
        gpus = [p.name for p in hardware.load_profiles() if p.vendor != "cpu"]
        if prof is None or prof.vendor == "cpu":
            raise UsageError(f"--device-profile {name!r}: no such GPU profile in hardware.yaml "
                             f"(known: {', '.join(gpus)})")
    return prof.model_dump()


_LOADED: dict = {}


def builds_without_gpu(mod) -> bool:
    """Whether a candidate compiles a plan with no GPU: its `build_plan(case, device profile, config)` hook."""
    return callable(getattr(mod, "build_plan", None))


def compile_kernel(path: str, case_json: str, config: Optional[dict],
                   profile: Optional[dict] = None) -> tuple[float, Optional[str]]:
    """In a worker: build one shape's kernels into TileLang's disk cache, through the candidate's
    `build_plan(case, profile, config)` when a profile is given (no GPU, no CUDA context), else as its `prepare` does
    (on shape-only CUDA inputs: expanded views, no data). (seconds, None), or (seconds, the error's last line): as
    text, since a compiler's own exception may not survive the trip back and the pool would lose its worker."""
    t0 = time.perf_counter()
    try:
        from kopt import candidate
        from kopt.cases import Case

        mod = _LOADED.get(path) or _LOADED.setdefault(path, candidate.load(Path(path)))
        case = Case.model_validate_json(case_json)
        if profile is not None:
            mod.build_plan(case.shape_dict(), profile, config)
        else:
            _prepare_shape(mod, case, config)
    except Exception as e:
        lines = str(e).strip().splitlines()
        return time.perf_counter() - t0, f"{type(e).__name__}: {lines[-1] if lines else ''}"[:300]
    return time.perf_counter() - t0, None


def _prepare_shape(mod, case, config: Optional[dict]) -> None:
    """The candidate's `prepare` on a case's shape: CUDA tensors of the right shapes and no data."""
    import torch

    v = case.variant
    dt = torch.float16 if v.dtype.value == "fp16" else torch.bfloat16
    b, s, hkv, d = case.batch, case.seqlen_k, case.kv_heads, v.head_dim
    one = torch.zeros((1, 1, 1, 1), device="cuda", dtype=dt)
    q = torch.zeros((b, 1, case.q_heads, d), device="cuda", dtype=dt)
    lens = torch.full((b,), s, dtype=torch.int32, device="cuda")
    bt = None
    if v.page_size:
        pages = -(-s // v.page_size)
        k = one.expand(b * pages, v.page_size, hkv, d)
        bt = torch.zeros((b, pages), device="cuda", dtype=torch.int32)
    else:
        k = one.expand(b, s, hkv, d)
    mod.prepare(q, k, k, lens, bt, None, config)


#: What a GPU-less worker imports before it is forked (the forkserver's preload): each worker then starts in
#: milliseconds instead of importing torch and TileLang itself.
PRELOAD = ["torch", "tilelang", "kopt.cases", "kopt.candidate"]


def forkserver(start: bool = False):
    """multiprocessing's forkserver context with PRELOAD; `start`: start its server now (it imports PRELOAD while
    the caller goes on), else it starts with the first worker."""
    from multiprocessing import get_context

    ctx = get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    if start:
        from multiprocessing import forkserver as fs

        fs.ensure_running()
    return ctx


def compile_all(path: Path, todo: list[Kernel], jobs: int, emit: Callable[[str], None] = print,
                profile: Optional[dict] = None) -> int:
    """Compile `todo` with `jobs` worker processes; one line per kernel as it finishes, then a summary. Returns how
    many failed (a plan that failed counts, reported first).

    With `profile` (the candidate must have `build_plan`), the workers compile for that device with no GPU: forked
    from one process that has imported torch and TileLang (multiprocessing's forkserver, which never touches CUDA).
    Without it, each worker is spawned with its own CUDA context and runs the candidate's `prepare`."""
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from multiprocessing import get_context

    t0 = time.perf_counter()
    failed = 0
    for k in (k for k in todo if k.error):
        failed += 1
        emit(f"[plan] {k.label}: FAILED {k.error}")
    build = [k for k in todo if not k.error]
    ctx = forkserver() if profile is not None else get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as ex:
        futs = {ex.submit(compile_kernel, str(path), k.case.model_dump_json(), k.config, profile): k for k in build}
        for i, f in enumerate(as_completed(futs), 1):
            try:
                dt, err = f.result()
            except Exception as e:  # the worker itself died: reported, the others go on
                dt, err = 0.0, f"{type(e).__name__}: {e}"
            failed += err is not None
            emit(f"[{i}/{len(build)}] {futs[f].label}: " + (f"FAILED {err}" if err else f"{dt:.1f} s"))
    emit(f"prewarm: {len(todo) - failed}/{len(todo)} kernels in {time.perf_counter() - t0:.1f} s with {jobs} jobs")
    return failed


def default_jobs() -> int:
    """Worker processes when none is given: the CPUs but two, at least one."""
    return max(1, (os.cpu_count() or 2) - 2)


def warm_cases(path: Path, cases: list, emit: Callable[[str], None], jobs: Optional[int] = None,
               config: Optional[dict] = None, timeout_s: float = 900.0) -> Optional[str]:
    """Compile the distinct kernels of `cases` for this host's CUDA device in parallel, ahead of the run that checks
    them, in a process of its own (`python -m kopt.eval.prewarm`, through kopt.proc: the candidate's code never runs
    in the process that judges it, and a timeout ends the compile workers too); its one summary line goes to `emit`.
    None when done (a kernel that failed to build is left to the run, which reports it as its row), else why nothing
    was warmed (a candidate without the device_plan / prepare hooks, a device no hardware.yaml profile names, the
    process's own failure or timeout)."""
    import json
    import tempfile

    from kopt import proc

    with tempfile.TemporaryDirectory(prefix="kopt-prewarm-") as tmp:
        spec = Path(tmp) / "cases.json"
        spec.write_text(json.dumps({"cases": [c.model_dump(mode="json") for c in cases], "config": config,
                                    "jobs": jobs}))
        done = proc.run_logged(proc.python_module("kopt.eval.prewarm", str(path), str(spec)), Path(tmp) / "log",
                               timeout_s)
    if done.timed_out:
        return f"the compiles took over {timeout_s:g} s"
    lines = done.output.strip().splitlines()
    said = [x for x in lines if x.startswith(("compiled ", _NOT))]
    if done.rc == 0 and said:
        if said[-1].startswith(_NOT):
            return said[-1][len(_NOT):]
        emit(said[-1])
        return None
    return f"exit {done.rc}: {lines[-1] if lines else 'no message'}"[:300]


def warm_each(todo: list[tuple[Path, Optional[dict]]], cases: list, who: str) -> None:
    """warm_cases for each (candidate file, config) of `todo`, side by side, the compile jobs shared out among them:
    a verdict's candidate (H200, 2026-12-05: the quick verdict spent over 300 s compiling its 40-odd kernels one at
    a time, and 122 s with most of them cached), or an A/B run's candidate and earlier candidate files (a new plan on
    every held-out draw: 10-25 s each on an H100 host). Each file's summary line, or the reason nothing was warmed
    (its kernels then compile as the rows come), goes to stderr as `kopt <who>: ...`, named by its file where there
    are several."""
    import sys
    import threading

    jobs = max(1, default_jobs() // len(todo))

    def one(path: Path, config: Optional[dict]) -> None:
        label = f"{path.name} ({path.parent.name}): " if len(todo) > 1 else ""

        def say(text: str) -> None:
            print(f"kopt {who}: {label}{text}", file=sys.stderr, flush=True)

        why = warm_cases(path, cases, say, jobs=jobs, config=config)
        if why:
            say(f"kernels not compiled ahead: {why}")

    # the first file in this thread (Ctrl-C here takes its compile group down, as run_logged does); the others beside
    # it, each in a thread of its own
    threads = [threading.Thread(target=one, args=item, daemon=True) for item in todo[1:]]
    for t in threads:
        t.start()
    one(*todo[0])
    for t in threads:
        t.join()


#: How the child says why it compiled nothing (its other lines are the compilers' and libraries' own).
_NOT = "not compiled: "


def _warm(path: Path, spec: dict) -> str:
    """The child's half of warm_cases: a line saying what was compiled, or why nothing was. For a candidate whose
    file names build_plan (a cheap text test; a wrong guess costs time, never correctness) the forkserver starts
    first, so that its imports overlap the candidate's and the plans."""
    if "build_plan" in path.read_text(errors="replace"):
        forkserver(start=True)
    from kopt import candidate
    from kopt.cases import Case
    from kopt.errors import UsageError

    mod = candidate.load(path)
    if not all(callable(getattr(mod, h, None)) for h in ("device_plan", "prepare")):
        return _NOT + "the candidate has no device_plan()/prepare() hooks"
    config = spec.get("config")
    try:
        profile = device_profile()
        todo = distinct(mod, [(Case.model_validate(c), config) for c in spec["cases"]], profile)
    except UsageError as e:
        return _NOT + str(e)
    build = [k for k in todo if not k.error]
    if not build:
        return _NOT + "no kernel to compile"
    n = min(len(build), spec.get("jobs") or default_jobs())
    t0 = time.perf_counter()
    failed = compile_all(path, build, n, emit=lambda _line: None,
                         profile=profile if builds_without_gpu(mod) else None)
    took = time.perf_counter() - t0
    return f"compiled {len(build) - failed}/{len(build)} kernels ahead in {took:.1f} s with {n} jobs"


if __name__ == "__main__":
    import json
    import sys

    print(_warm(Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())), flush=True)
