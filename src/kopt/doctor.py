"""Environment report: device, versions, toolchain, profilers, and what will and will not run."""

from __future__ import annotations

import shutil
import subprocess

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
