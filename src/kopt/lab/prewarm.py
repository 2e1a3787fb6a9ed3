"""`kopt lab prewarm`: compile every kernel a GPU run will need, in parallel, ahead of it.

TileLang keeps compiled kernels in its on-disk cache, so the benches and tests that follow load them instead of
compiling one after the other (about 10 s each on an H200 host). Through the candidate's contract only: its
`device_plan(shape, device profile, config)` hook says which kernels a shape resolves to (on any machine, so the
list is deduplicated before anything compiles and `--list` runs without a GPU), and its `prepare(...)` compiles one
shape's kernels on the device, in a worker process of its own per job.

The shapes: by default the benches' variants, the GPU test matrix and the verify matrix, with the second and last
tuning config of each contiguous fp16 head-dim-128 case (the candidate's `configs`); `verify`: only what
`kopt bench --all` and `kopt verify` need (with `bf16` every case in bf16 too, as `kopt peers --dtype bf16` times
them; with a held-out seed the draws `kopt verify --heldout-seed` times); `ids`: only those cases (in pages of
`page_size`). Extra configs are compiled for the named (non-ragged) cases, a '+{..}' one laid over each case's plan as
`kopt lab screen` lays it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from kopt.lab.configs import LabConfig, resolved_config

#: device_plan fields that do not select a kernel: the device's facts, and the split count (a kernel depends on
#: whether a plan splits, not on how many ways: `split` stands for it in the key).
NOT_KERNEL = frozenset({"num_splits", "device", "backend", "arch", "units", "warp_size", "smem_per_unit",
                        "l2_bytes", "smem_bytes"})
#: The GPU test matrix's head layouts of case 10 (kv heads, gqa), each ragged, contiguous and in 256-token pages.
HEAD_LAYOUTS = ((32, 1), (8, 1), (1, 32), (1, 8), (2, 16))


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


def default_shapes() -> list:
    """The benches' variants (fp16 and bf16, contiguous and paged), head dim 64 of cases 1, 4, 10 and 13, and the GPU
    test matrix's head layouts of case 10."""
    from kopt.cases import load_cases

    out = []
    for c in load_cases():
        for dtype in ("fp16", "bf16"):
            for page in (0, 16, 32, 64, 256) if c.kind == "ragged" else (0, 16, 64, 256):
                out.append(c.with_variant(dtype=dtype, page_size=page))
        if c.id in (1, 4, 10, 13):
            out += [c.with_variant(dtype=dtype, head_dim=64) for dtype in ("fp16", "bf16")]
        if c.id == 10:
            for kv, g in HEAD_LAYOUTS:
                for page in (0, 256):
                    m = c.with_variant(page_size=page, seqlens="ragged")
                    out.append(m.model_copy(update={"kv_heads": kv, "gqa": g, "batch": 3, "seqlen_k": 3001}))
    return out


def verify_shapes(bf16: bool = False, heldout: int = 0, heldout_seed: Optional[int] = None) -> list:
    """What `kopt bench --all` and `kopt verify` time and check: every case, the verify matrix (hidden shapes are drawn
    at verdict time and compile on demand); with bf16 every case in bf16 too; with a held-out seed its draws
    (`heldout` of them, by default the case file's verify.heldout)."""
    from kopt.cases import load_file
    from kopt.eval import heldout_draw, matrix_cases

    cf = load_file()
    extra = [c.with_variant(dtype="bf16") for c in cf.cases] if bf16 else []
    held = heldout_draw(heldout or cf.verify.heldout, heldout_seed, "cuda") if heldout_seed is not None else []
    held += [c.with_variant(dtype="bf16") for c in held] if bf16 else []
    return list(cf.cases) + matrix_cases(cf) + extra + held


def kernel_key(case, plan: dict) -> tuple:
    """What selects a compiled kernel: the call's dtype and heads, and every plan field but NOT_KERNEL."""
    v = case.variant
    fields = {k: tuple(x) if isinstance(x, list) else x for k, x in plan.items() if k not in NOT_KERNEL}
    fields["split"] = int(plan.get("num_splits") or 1) > 1
    return (("dtype", v.dtype.value), ("hq", case.q_heads), ("hkv", case.kv_heads), ("d", v.head_dim),
            *sorted(fields.items()))


def kernels(mod, keys: Optional[frozenset], shapes: list, profile: dict, extra: list[LabConfig] = (),
            tuning: bool = True, screen_page: Optional[int] = None) -> list[Kernel]:
    """The distinct kernels of `shapes` (with their configs) on the device of `profile` (a hardware.yaml entry as a
    dict), through the candidate's device_plan. Per contiguous fp16 head-dim-128 shape (or, screening, a shape in the
    screen's `screen_page` layout): with `tuning` the candidate's second and last tuning config; `extra` configs on
    the named (non-ragged) ones."""
    seen: dict[tuple, Kernel] = {}
    for case in shapes:
        v, shape = case.variant, case.shape_dict()
        cfgs: list[Optional[dict]] = [None]
        layout_ok = not v.page_size if screen_page is None else (v.page_size or 0) == screen_page
        if v.dtype.value == "fp16" and layout_ok and v.head_dim == 128:
            if tuning:
                allc = mod.configs(shape)
                cfgs += [allc[1], allc[-1]] if len(allc) > 1 else []
            if extra and v.seqlens.value != "ragged":
                own = resolved_config(mod.device_plan(shape, profile, None), keys)
                cfgs += [c.full(own) for c in extra]
        for cfg in cfgs:
            try:
                k = Kernel(kernel_key(case, mod.device_plan(shape, profile, cfg)), case, cfg)
            except ValueError as e:  # a config this shape or device cannot run: its build would fail too
                k = Kernel((("case", case.id), ("variant", v.label()), ("config", str(cfg))), case, cfg, str(e))
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


def plan(path: Path, profile: dict, ids: Optional[list[int]] = None, page_size: int = 0, verify: bool = False,
         bf16: bool = False, heldout: int = 0, heldout_seed: Optional[int] = None,
         extra: list[LabConfig] = ()) -> list[Kernel]:
    """The kernels to compile (see the module's docstring) for the candidate at `path` on the device of `profile`."""
    from kopt import candidate
    from kopt.cases import load_cases, select
    from kopt.errors import UsageError

    mod = candidate.load(path)
    for hook in ("device_plan", "prepare", "configs"):
        if not callable(getattr(mod, hook, None)):
            raise UsageError(f"the candidate has no {hook}() hook: prewarm resolves and compiles through it")
    keys = candidate.config_keys(path)
    if verify:
        return kernels(mod, keys, verify_shapes(bf16, heldout, heldout_seed), profile, tuning=False)
    if ids:
        shapes = [c.with_variant(page_size=page_size) for c in select(load_cases(), ids)]
        return kernels(mod, keys, shapes, profile, extra, tuning=False, screen_page=page_size)
    return kernels(mod, keys, default_shapes(), profile, extra)


_LOADED: dict = {}


def compile_kernel(path: str, case_json: str, config: Optional[dict]) -> tuple[float, Optional[str]]:
    """In a worker: build one shape's kernels as the candidate's `prepare` does (on shape-only inputs: expanded
    views, no data), into TileLang's disk cache. (seconds, None), or (seconds, the error's last line): as text, since
    a compiler's own exception may not survive the trip back and the pool would lose its worker."""
    t0 = time.perf_counter()
    try:
        import torch

        from kopt import candidate
        from kopt.cases import Case

        mod = _LOADED.get(path) or _LOADED.setdefault(path, candidate.load(Path(path)))
        case = Case.model_validate_json(case_json)
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
    except Exception as e:
        lines = str(e).strip().splitlines()
        return time.perf_counter() - t0, f"{type(e).__name__}: {lines[-1] if lines else ''}"[:300]
    return time.perf_counter() - t0, None


def compile_all(path: Path, todo: list[Kernel], jobs: int, emit: Callable[[str], None] = print) -> int:
    """Compile `todo` with `jobs` worker processes (spawned: each its own CUDA context); one line per kernel as it
    finishes, then a summary. Returns how many failed (a plan that failed counts, reported first)."""
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from multiprocessing import get_context

    t0 = time.perf_counter()
    failed = 0
    for k in (k for k in todo if k.error):
        failed += 1
        emit(f"[plan] {k.label}: FAILED {k.error}")
    build = [k for k in todo if not k.error]
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as ex:
        futs = {ex.submit(compile_kernel, str(path), k.case.model_dump_json(), k.config): k for k in build}
        for i, f in enumerate(as_completed(futs), 1):
            try:
                dt, err = f.result()
            except Exception as e:  # the worker itself died: reported, the others go on
                dt, err = 0.0, f"{type(e).__name__}: {e}"
            failed += err is not None
            emit(f"[{i}/{len(build)}] {futs[f].label}: " + (f"FAILED {err}" if err else f"{dt:.1f} s"))
    emit(f"prewarm: {len(todo) - failed}/{len(todo)} kernels in {time.perf_counter() - t0:.1f} s with {jobs} jobs")
    return failed
