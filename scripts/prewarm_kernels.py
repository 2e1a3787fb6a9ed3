"""Compile every CUDA kernel variant of the shipped candidate in parallel, ahead of a GPU session.

TileLang keeps compiled kernels in its on-disk cache, so the benches and tests that follow load them
instead of compiling one after the other (about 10 s each on an H200 host).

    python3 scripts/prewarm_kernels.py [--jobs N] [--list] [--configs 'JSON;JSON']

The variants: the kernel each shape resolves to (the candidate's own plan: heuristic, tuning table)
for the benches' variants, the GPU test matrix, the verify matrix and the tuning configs tried
first (see _shapes()); with --configs, also each given config on the 14 cases (fp16, contiguous, head
dim 128), the kernels a `kopt bench --config` screen of those configs needs. Needs a CUDA device (the plan reads its
unit count and arch). Prints one line per finished kernel and a summary.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOL = os.path.join(ROOT, "solution", "tilelang")

def _verify_shapes(bf16: bool = False, heldout: int = 0, heldout_seed: int | None = None):
    """What `kopt bench --all` and `kopt verify` time and check: every case as the table defines it, and
    each verify-matrix entry's variants (hidden shapes are drawn at verdict time and compile on demand);
    with bf16, every case in bf16 too (what `kopt peers --all --dtype bf16` times); with a held-out seed, the
    held-out draws `kopt verify --heldout-seed` times."""
    sys.path.insert(0, os.path.join(ROOT, "src"))
    from kopt.cases import load_file
    from kopt.eval.bench import BenchOptions
    from kopt.eval.verdict import heldout_draw, plan

    cf = load_file(os.path.join(ROOT, "bench", "cases.yaml"))
    matrix = plan(cf, BenchOptions())[1]  # the Verdict's own expansion of the matrix
    extra = [c.with_variant(dtype="bf16") for c in cf.cases] if bf16 else []
    held = heldout_draw(heldout or cf.verify.heldout, heldout_seed, "cuda") if heldout_seed is not None else []
    held += [c.with_variant(dtype="bf16") for c in held] if bf16 else []
    return list(cf.cases) + [c for c, _ in matrix] + extra + held


def _shapes(ids: list[int] | None = None, page_size: int = 0):
    """The cases whose kernels are compiled: the benches' variants, the GPU test matrix and the verify
    matrix (specs() adds the second and last tuning config of the contiguous fp16 ones); with `ids`,
    only those cases as the table defines them, in pages of `page_size` when it is given (a configuration
    screen: gpu_config_screen.py --page-size)."""
    sys.path.insert(0, os.path.join(ROOT, "src"))
    from kopt.cases import load_cases

    cases = load_cases()
    if ids:
        return [c.with_variant(page_size=page_size) if page_size else c for c in cases if c.id in ids]
    out = []
    for c in cases:
        for dtype in ("fp16", "bf16"):
            for page in (0, 16, 32, 64, 256) if c.kind == "ragged" else (0, 16, 64, 256):
                out.append(c.with_variant(dtype=dtype, page_size=page))
        if c.id in (1, 4, 10, 13):
            for dtype in ("fp16", "bf16"):
                out.append(c.with_variant(dtype=dtype, head_dim=64))
        if c.id == 10:
            for kv, g in ((32, 1), (8, 1), (1, 32), (1, 8), (2, 16)):
                for page in (0, 256):
                    m = c.with_variant(page_size=page, seqlens="ragged")
                    out.append(m.model_copy(update={"kv_heads": kv, "gqa": g, "batch": 3, "seqlen_k": 3001}))
    return out


#: Plan fields that do not select a kernel: the device target (set in the worker) and what a built plan holds.
_RUNTIME_FIELDS = ("target", "main", "comb", "dummy_bt", "opart", "lse", "cnt")


def _kernel_fields(rk) -> tuple:
    """The plan fields that select a compiled kernel: every field of that candidate's plan but the runtime
    ones, so an iteration that adds a field (an older one that lacks it) needs no list kept here."""
    return tuple(f for f in rk._Plan.__slots__ if f not in _RUNTIME_FIELDS)


def parse_configs(text: str) -> list[tuple[dict, bool]]:
    """'JSON;+JSON' -> [(config, over_default)]: a leading '+' lays the config over each case's own plan."""
    out = []
    for part in filter(None, (x.strip() for x in text.split(";"))):
        out.append((json.loads(part.lstrip("+")), part.startswith("+")))
    return out


def _over(rk, own) -> dict:
    """A plan as the config a '+{..}' entry is laid over, as gpu_config_screen.py lays it: the config keys of
    run_kernel.plan_info's view of the plan (last_cta only where there are splits; booleans as 0/1)."""
    info = {f: getattr(own, f) for f in rk._CFG_KEYS if hasattr(own, f)}
    if "last_cta" in info:
        info["last_cta"] = own.last_cta and own.num_splits > 1
    return {k: int(v) if isinstance(v, bool) else v for k, v in info.items()}


def specs(extra: list[tuple[dict, bool]] | None = None, ids: list[int] | None = None, verify: bool = False,
          bf16: bool = False, page_size: int = 0, heldout: int = 0, heldout_seed: int | None = None) -> list[tuple]:
    """Distinct kernels the shapes resolve to: the plan fields run_kernel._cuda_kernels reads (with
    `verify`, only what `kopt verify` needs: no tuning configs beside each case's own plan). `extra`:
    (config, over) pairs, over: laid over the case's own plan (gpu_config_screen's '+{..}'); with `ids`
    and `page_size`, the screen's cases in pages of that size."""
    import torch

    sys.path.insert(0, SOL)
    import run_kernel as rk

    fields = _kernel_fields(rk)
    seen = {}
    for case in (_verify_shapes(bf16, heldout, heldout_seed) if verify else _shapes(ids, page_size)):
        v = case.variant
        dt = torch.float16 if v.dtype == "fp16" else torch.bfloat16
        b, s, hkv, d = case.batch, case.seqlen_k, case.kv_heads, v.head_dim
        q = torch.empty((b, 1, case.q_heads, d), device="cuda", dtype=dt)
        one = torch.empty((1, 1, 1, 1), device="cuda", dtype=dt)
        bt = None
        if v.page_size:
            pages = -(-s // v.page_size)
            k = one.expand(b * pages, v.page_size, hkv, d)
            bt = torch.empty((b, pages), device="cuda", dtype=torch.int32)
        else:
            k = one.expand(b, s, hkv, d)
        cfgs = [None]
        screened = ids and v.page_size == page_size  # a screen's case in the screen's layout
        if v.dtype == "fp16" and (not v.page_size or screened) and v.head_dim == 128 and not verify:
            if not ids:  # a screen (ids) needs the cases' own plans and its configs only
                allc = rk.configs({"seqlen_k": s})
                cfgs += [allc[1], allc[-1]]
            if v.seqlens != "ragged" and extra:  # the 14 cases themselves, not the GPU tests' head layouts
                own = rk._cuda_plan(q, k, bt, None, None)  # the plan a '+{..}' config is laid over
                cfgs += [{**_over(rk, own), **c} if over else c for c, over in extra]
        for cfg in cfgs:
            p = rk._cuda_plan(q, k, bt, None, cfg)
            p.num_splits = min(p.num_splits, 2)  # the kernels depend on split or not, not on the count
            seen.setdefault(tuple((f, getattr(p, f, None)) for f in fields), None)  # a slot a plan left unset: None
    return list(seen)


def _compile(spec: tuple) -> tuple:
    """Build the plan's kernels the way run_kernel does (split, combine), into TileLang's disk cache:
    (spec, seconds, None), or (spec, seconds, the error's last line) when the build failed (as text: a
    compiler's own exception may not survive the trip back, and the pool would lose its worker)."""
    sys.path.insert(0, SOL)
    import run_kernel as rk
    import torch

    t0 = time.perf_counter()
    try:
        p = rk._Plan()
        for f, v in spec:
            setattr(p, f, v)
        p.target = rk._cuda.cuda_target(torch.device("cuda", 0))
        rk._cuda_kernels(p)
    except Exception as e:
        lines = str(e).strip().splitlines()
        return spec, time.perf_counter() - t0, f"{type(e).__name__}: {lines[-1] if lines else ''}"[:300]
    return spec, time.perf_counter() - t0, None


def _label(spec: tuple) -> str:
    return " ".join(f"{f}={v}" for f, v in spec)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    ap.add_argument("--list", action="store_true", help="print the variants and exit")
    ap.add_argument("--configs", default="", help="';'-separated JSON configs, each also compiled for the 14 cases "
                                                   "('+JSON': laid over each case's own plan)")
    ap.add_argument("--cases", default="", help="comma-separated case ids: only these cases (fp16, contiguous)")
    ap.add_argument("--verify", action="store_true", help="only what bench --all and verify need (the cases, the "
                                                          "verify matrix)")
    ap.add_argument("--bf16", action="store_true", help="with --verify: every case in bf16 too (kopt peers)")
    ap.add_argument("--page-size", type=int, default=0, help="with --cases: those cases in pages of this size "
                                                             "(a screen's --page-size)")
    ap.add_argument("--heldout-seed", type=int, default=None, help="with --verify: also the held-out draws of "
                                                                   "this seed (kopt verify --heldout-seed)")
    ap.add_argument("--heldout", type=int, default=0, help="with --heldout-seed: how many draws (default: the "
                                                           "case file's verify.heldout)")
    a = ap.parse_args(argv)
    sys.path.insert(0, os.path.join(ROOT, "src"))
    from kopt import hardware as _hw

    _hw.exit_unless_cuda(os.path.basename(__file__))  # a GPU tool on a host without one: one line, exit 2
    ids = [int(x) for x in a.cases.split(",") if x.strip()]
    todo = specs(parse_configs(a.configs), ids or None, a.verify, a.bf16, a.page_size, a.heldout, a.heldout_seed)
    if a.list:
        for s in todo:
            print(_label(s))
        print(f"{len(todo)} kernels")
        return 0
    t0 = time.perf_counter()
    failed = 0
    with ProcessPoolExecutor(max_workers=a.jobs, mp_context=get_context("spawn")) as ex:
        futs = {ex.submit(_compile, s): s for s in todo}
        for i, f in enumerate(as_completed(futs), 1):
            try:
                spec, dt, err = f.result()
            except Exception as e:  # the worker itself died: report and go on
                spec, dt, err = futs[f], 0.0, f"{type(e).__name__}: {e}"
            failed += err is not None
            print(f"[{i}/{len(todo)}] {_label(spec)}: " + (f"FAILED {err}" if err else f"{dt:.1f} s"), flush=True)
    print(f"prewarm: {len(todo) - failed}/{len(todo)} kernels in {time.perf_counter() - t0:.1f} s "
          f"with {a.jobs} jobs", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
