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

from pathlib import Path
from typing import Optional

from kopt.eval import Kernel, builds_without_gpu, distinct
from kopt.lab.common import plan_oracle
from kopt.lab.configs import LabConfig, resolved_config

#: The GPU test matrix's head layouts of case 10 (kv heads, gqa), each ragged, contiguous and in 256-token pages.
HEAD_LAYOUTS = ((32, 1), (8, 1), (1, 32), (1, 8), (2, 16))


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


def kernels(mod, keys: Optional[frozenset], shapes: list, profile: dict, extra: list[LabConfig] = (),
            tuning: bool = True, screen_page: Optional[int] = None) -> list[Kernel]:
    """The distinct kernels of `shapes` (with their configs) on the device of `profile` (a hardware.yaml entry as a
    dict), through the candidate's device_plan. Per contiguous fp16 head-dim-128 shape (or, screening, a shape in the
    screen's `screen_page` layout): with `tuning` the candidate's second and last tuning config; `extra` configs on
    the named (non-ragged) ones."""
    items = []
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
                cfgs += [c.full(own, plan_oracle(mod, case, profile)) for c in extra]
        items += [(case, cfg) for cfg in cfgs]
    return distinct(mod, items, profile)


def plan(path: Path, profile: dict, ids: Optional[list[int]] = None, page_size: int = 0, verify: bool = False,
         bf16: bool = False, heldout: int = 0, heldout_seed: Optional[int] = None,
         extra: list[LabConfig] = (), gpu_less: bool = False) -> list[Kernel]:
    """The kernels to compile (see the module's docstring) for the candidate at `path` on the device of `profile`;
    `gpu_less`: they will be compiled with no GPU, so the candidate needs its build_plan hook too."""
    from kopt import candidate
    from kopt.cases import load_cases, select
    from kopt.errors import UsageError

    mod = candidate.load(path)
    for hook in ("device_plan", "prepare", "configs"):
        if not callable(getattr(mod, hook, None)):
            raise UsageError(f"the candidate has no {hook}() hook: prewarm resolves and compiles through it")
    if gpu_less and not builds_without_gpu(mod):
        raise UsageError("--device-profile without --list compiles with no GPU, through the candidate's build_plan() "
                         "hook, which this candidate lacks")
    keys = candidate.config_keys(path)
    if verify:
        return kernels(mod, keys, verify_shapes(bf16, heldout, heldout_seed), profile, tuning=False)
    if ids:
        shapes = [c.with_variant(page_size=page_size) for c in select(load_cases(), ids)]
        return kernels(mod, keys, shapes, profile, extra, tuning=False, screen_page=page_size)
    return kernels(mod, keys, default_shapes(), profile, extra)


