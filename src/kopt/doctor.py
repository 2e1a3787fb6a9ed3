"""Environment report: device, versions, toolchain, profilers, and what will and will not run."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Optional

from kopt.baselines.base import dist_version


def _tool_version(exe: str, args=("--version",)) -> str | None:
    path = shutil.which(exe)
    if not path:
        return None
    try:
        out = subprocess.run([path, *args], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "found (version unknown)"
    lines = [x for x in out.strip().splitlines() if x.strip()]
    return lines[-1].strip() if lines else "found"


def report() -> dict:
    """Everything `kopt doctor` shows, as a dict."""
    import platform

    import torch

    from kopt.baselines import flash_attn_version

    d: dict = {"python": platform.python_version(), "torch": torch.__version__,
               "tilelang": dist_version("tilelang"), "flash_attn": flash_attn_version(),
               "kopt": dist_version("kopt") or "source", "nvcc": _tool_version("nvcc"),
               "profilers": {t: shutil.which(t) is not None for t in ("ncu", "nsys", "mcProfiler", "mcTracer")}}
    cuda = torch.cuda.is_available()
    d["cuda_available"] = cuda
    if cuda:
        p = torch.cuda.get_device_properties(0)
        d["device"] = {"name": p.name, "capability": f"{p.major}.{p.minor}", "units": p.multi_processor_count,
                       "memory_gib": round(p.total_memory / 2**30, 1),
                       "l2_mib": round(getattr(p, "L2_cache_size", 0) / 2**20, 1),
                       "tilelang_arch": f"sm_{p.major}{p.minor}" + ("a" if p.major >= 9 else "")}
    else:
        d["device"] = {"name": "cpu"}
    from kopt.eval.warm import supervisors

    d["kept_children"] = supervisors()
    from kopt import bytecode

    # where kopt's processes keep their bytecode: null when Python's own rule applies (kopt.bytecode)
    d["bytecode_cache"] = bytecode.cache_dir()
    d["will_run"], d["will_not_run"] = _plan(d)
    return d


def _plan(d: dict) -> tuple[list[str], list[str]]:
    yes, no = [], []
    if d["tilelang"]:
        yes.append("TileLang C-target candidate on CPU (kopt bench --device cpu)")
    else:
        no.append("TileLang candidates: tilelang is not installed")
    if d["cuda_available"]:
        yes.append("CUDA candidates on " + d["device"]["name"])
        (yes if d["flash_attn"] else no).append(
            "flash_attn_with_kvcache "
            "baseline" + ("" if d["flash_attn"] else ": flash-attn not importable, torch-sdpa used and labelled"))
        (yes if d["profilers"]["ncu"] else no).append("kopt profile --tool "
                                                      "ncu" + ("" if d["profilers"]["ncu"] else ": ncu not found"))
    else:
        no.append("CUDA timing and the flash-attn baseline: no CUDA device (CPU runs use REF:torch-cpu)")
        no.append("kopt profile --tool ncu: no CUDA device (torch profiler fallback works)")
    if not (d["profilers"]["mcProfiler"] or d["profilers"]["mcTracer"]):
        no.append("MetaX mcProfiler/mcTracer: not found")
    if d["nvcc"]:
        yes.append("CUDA code generation checks (nvcc present)")
    return yes, no


# ---------------------------------------------------------------- the plan of a device that is not here

#: The switches that need the device's own backend, and what decides each in the plan (tl_decode_cuda).
HOPPER_ONLY = {"pdl": "programmatic dependent launch: CUDA, compute capability 9+",
               "red_once": "a prelude that specializes TileLang's CUDA reduce template for warps of 32",
               "fast_math": "nvcc's --use_fast_math (approximate division, flush to zero)"}


def gpu_profile(device: str):
    """The hardware.yaml profile of a GPU by name; a UsageError naming the known ones for anything else."""
    from kopt import hardware
    from kopt.errors import UsageError

    prof = hardware.profile(device)
    gpus = [p.name for p in hardware.load_profiles() if p.vendor != "cpu"]
    if prof is None or prof.vendor == "cpu":
        raise UsageError(f"--plan-for {device!r}: no such GPU profile in hardware.yaml (known: {', '.join(gpus)})")
    return prof


def case_plans(device: str, cases: list, candidate: Path | None = None) -> list[dict]:
    """The plan a candidate resolves for each case (named or a held-out draw) on a device of hardware.yaml, from the
    device's profile, with no GPU: per case {"case": id, "plan": its device_plan hook's dict, or None, "why": the
    reason where there is none (no hook; a shape the kernel refuses, in its own words)}. The candidate is loaded with
    its own sibling modules (kopt.candidate.loaded), so two candidates of the same file names plan side by side, and
    the process's imports are as they were after."""
    from kopt import paths
    from kopt.candidate import loaded
    from kopt.store import resolve_candidate

    prof = gpu_profile(device).model_dump()
    out = []
    with loaded(resolve_candidate(candidate if candidate else paths.default_candidate())) as mod:
        for c in cases:
            plan, why = hook_plan(mod, c.shape_dict(), prof, None)
            out.append({"case": c.id, "plan": plan, "why": why})
    return out


_ABSENT = object()


def plan_fields_apart(a: Optional[dict], b: Optional[dict]) -> list[str]:
    """The fields two plans (device_plan dicts, None where a candidate has none) hold apart, sorted; ["plan"] where
    only one has a plan. A field one candidate does not report is a switch its kernel lacks: it reads as off there, so
    it is apart only where the other plan turns it on (not False, 0 or None)."""
    if a is None or b is None:
        return [] if a is b else ["plan"]

    def get(p, k):
        v = p.get(k, _ABSENT)
        return None if v is _ABSENT or v in (False, 0, None) else v

    return sorted(k for k in set(a) | set(b) if (a[k] != b[k] if k in a and k in b else get(a, k) != get(b, k)))


def hook_plan(mod, shape: dict, profile: dict, config: dict | None) -> tuple[dict | None, str]:
    """(the candidate's device_plan hook's dict, "") or (None, why): it has no hook, or it refuses the shape or the
    config on that device (a ValueError: the answer, in its own words, not a crash)."""
    if not hasattr(mod, "device_plan"):
        return None, "the candidate has no device_plan hook"
    try:
        return mod.device_plan(shape, profile, config), ""
    except ValueError as e:
        return None, str(e)


def plan_label(plan: dict | None) -> str:
    """A plan in a few words: its main kernel, split count (balanced: at most) and tile, and the balanced kernel's
    target CTAs; NA without a plan."""
    if plan is None:
        return "NA"
    kernel = plan["kernels"][0].removeprefix("decode_")
    splits = f"<={plan['num_splits']}" if plan.get("balanced") else str(plan["num_splits"])
    return f"{kernel} {splits}x{plan['block_N']}" + (f" {plan['balanced']} CTAs" if plan.get("balanced") else "")


def device_plan(device: str, case_id: int, *, candidate: Path | None = None, dtype: str | None = None,
                head_dim: int | None = None, page_size: int | None = None, config: dict | None = None,
                wave64: bool = False) -> dict:
    """The plan the candidate would run for a case on a device of hardware.yaml (e.g. C500), resolved here from the
    device's profile (its device_plan hook); with ``wave64`` also its kernels lowered for TileLang's HIP target and
    compiled for an AMD wave64 GPU where a toolchain is found (kopt.wave64). "plan" None with "why" when it cannot."""
    from kopt import paths
    from kopt import wave64 as w64
    from kopt.cases import load_cases, select

    prof = gpu_profile(device)
    case = select(load_cases(), [case_id])[0].with_variant(dtype=dtype, head_dim=head_dim, page_size=page_size)
    shape = case.shape_dict()
    cand = Path(candidate) if candidate else paths.default_candidate()
    out = {"device": prof.model_dump(include={"name", "vendor", "arch", "units", "warp_size", "l2_bytes",
                                              "smem_per_unit_bytes"}),
           "case": {"id": case.id, **shape}, "candidate": paths.relative(cand), "config": config, "plan": None,
           "why": "", "hopper_only": HOPPER_ONLY, "wave64": None}
    out["plan"], out["why"] = hook_plan(w64.load_candidate(str(cand)), shape, prof.model_dump(), config)
    if out["plan"] is None:
        return out
    if wave64:
        out["wave64"] = w64.as_dict(w64.check_plan(str(cand), shape, prof.model_dump(), config))
    return out
