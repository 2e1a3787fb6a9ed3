"""The wave64 check: a kernel plan's device source, lowered for TileLang's HIP target, compiled for an AMD wave64 GPU.

No machine here has the MetaX C500 (MACA, wave64), and the TileLang on PyPI has no MACA backend. Its HIP backend
lowers on any machine, and AMD's CDNA GPUs are wave64 like the C500: the nearest target reachable. The compile
uses Debian's toolchain (clang with its HIP and AMDGPU support, lld, ROCm's device libraries and HIP 5.2 headers);
what TileLang's HIP templates need beyond those headers is stubbed, and every stub is named in the result:

- ``hip/hip_bf16.h`` (ROCm 5.7+): HIP 5.2's ``hip/hip_bfloat16.h``, which defines the ``hip_bfloat16`` the
  templates use;
- ``rocwmma/rocwmma.hpp`` (not packaged by Debian 12): empty; these kernels use no rocWMMA;
- ``tl_templates/hip/debug.h`` where ``hip/amd_detail/amd_hip_fp8.h`` (ROCm 6.1+) is missing: empty (device
  printing helpers with fp8 overloads; these kernels print nothing);
- ``oclc_isa_version_942.bc`` where the device libraries stop at gfx940 (ROCm 5.2): gfx940's (the ISA-version
  constant the libraries read; gfx940 is the first MI300 target of the same CDNA3 family).

It proves that the plan's source is valid HIP C++ for a wave64 target and what registers it takes there (and the
dynamic shared memory its lowering asks for); not that MACA's compiler takes the MACA backend's source, nor anything
about C500 speed or results.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

#: The TileLang target the plans are lowered for: AMD MI300 (CDNA3, wave64).
HIP_TARGET = {"kind": "hip", "mcpu": "gfx942"}
ARCH = "gfx942"
#: Newest first: the first one found compiles (Debian's clang is built with its AMDGPU backend).
CLANGS = ("clang++-21", "clang++-20", "clang++-19", "clang++-18", "clang++-17", "clang++")
#: stub header -> (the installed header whose absence needs it, the stub's text)
_STUB_HEADERS = {
    "hip/hip_bf16.h": ("hip/hip_bf16.h", "#pragma once\n#include <hip/hip_bfloat16.h>\n"),
    "rocwmma/rocwmma.hpp": ("rocwmma/rocwmma.hpp", "#pragma once\n"),
    "tl_templates/hip/debug.h": ("hip/amd_detail/amd_hip_fp8.h", "#pragma once\n"),
}


@dataclass
class Toolchain:
    """What compiles a HIP source for ARCH here."""

    clang: str
    device_libs: Path
    hip_include: Path
    tl_include: Path


@dataclass
class KernelUsage:
    """One kernel's resources, from clang's kernel-resource-usage remarks."""

    name: str
    vgprs: int
    agprs: int
    sgprs: int
    lds_bytes: int
    spills: int
    """Registers spilled (VGPRs and SGPRs, a count; on gfx90a and later VGPRs spill to AGPRs first, not to memory)."""
    scratch_bytes: int
    """Scratch memory a lane uses (spills and private arrays that went to memory)."""
    occupancy: int
    """Waves a SIMD can hold at these registers."""


@dataclass
class HipCompile:
    """One source compiled (or not) for ARCH."""

    ok: bool
    code_object_bytes: int = 0
    kernels: list[KernelUsage] = field(default_factory=list)
    stubs: list[str] = field(default_factory=list)
    """What was stubbed for this compile (the module docstring says why each is)."""
    log: str = ""


def _first(paths) -> Optional[Path]:
    return next((Path(p) for p in paths if p and Path(p).exists()), None)


def find_toolchain() -> tuple[Optional[Toolchain], str]:
    """(the toolchain, "") or (None, why not): a clang, ROCm device libraries, HIP headers, TileLang's templates."""
    clang = next((shutil.which(c) for c in CLANGS if shutil.which(c)), None)
    rocm = os.environ.get("ROCM_PATH", "/opt/rocm")
    libs = _first([f"{rocm}/amdgcn/bitcode", *sorted(glob.glob("/usr/lib/*/amdgcn/bitcode")),
                   "/usr/lib/amdgcn/bitcode"])
    hip = _first([f"{rocm}/include/hip/hip_runtime.h", "/usr/include/hip/hip_runtime.h"])
    try:
        import tilelang

        tl = _first([Path(tilelang.__file__).parent / "src"])
    except ImportError:
        tl = None
    missing = [what for what, have in (("clang++ (Debian: clang-19 lld-19)", clang),
                                       ("ROCm device libraries (Debian: rocm-device-libs)", libs),
                                       ("HIP headers (Debian: libamdhip64-dev)", hip),
                                       ("TileLang's templates", tl)) if not have]
    if missing:
        return None, "no " + ", no ".join(missing)
    return Toolchain(clang, libs, hip.parent.parent, tl), ""


def _stubs(tc: Toolchain, work: Path, arch: str) -> tuple[Path, Path, list[str]]:
    """(include folder of the stub headers, device-library folder, the stubs made) for what this install lacks."""
    inc, made = work / "stub-include", []
    for rel, (real, text) in _STUB_HEADERS.items():
        if (tc.hip_include / real).exists():
            continue
        (inc / rel).parent.mkdir(parents=True, exist_ok=True)
        (inc / rel).write_text(text)
        made.append(rel)
    isa = f"oclc_isa_version_{arch.removeprefix('gfx')}.bc"
    libs = tc.device_libs
    if not (libs / isa).exists() and arch == "gfx942" and (libs / "oclc_isa_version_940.bc").exists():
        libs = work / "device-libs"
        libs.mkdir(exist_ok=True)
        for f in tc.device_libs.glob("*.bc"):
            (libs / f.name).symlink_to(f)
        (libs / isa).symlink_to(tc.device_libs / "oclc_isa_version_940.bc")
        made.append(f"{isa} (gfx940's)")
    return inc, libs, made


_REMARK = re.compile(r":\d+:\d+: remark:\s+(.+?): (\d+)")
_FUNC = re.compile(r"remark: Function Name: (\S+)")


def _usage(log: str) -> list[KernelUsage]:
    """The kernels' resource remarks (-Rpass-analysis=kernel-resource-usage), in source order."""
    out, cur = [], None
    for line in log.splitlines():
        m = _FUNC.search(line)
        if m:
            cur = {"name": m.group(1)}
            out.append(cur)
            continue
        m = _REMARK.search(line)
        if m and cur is not None:
            cur[m.group(1)] = int(m.group(2))
    return [KernelUsage(name=k["name"], vgprs=k.get("VGPRs", 0), agprs=k.get("AGPRs", 0), sgprs=k.get("SGPRs", 0),
                        lds_bytes=k.get("LDS Size [bytes/block]", 0),
                        spills=k.get("VGPRs Spill", 0) + k.get("SGPRs Spill", 0),
                        scratch_bytes=k.get("ScratchSize [bytes/lane]", 0),
                        occupancy=k.get("Occupancy [waves/SIMD]", 0)) for k in out]


def compile_source(source: str, tc: Toolchain, arch: str = ARCH, timeout_s: float = 300) -> HipCompile:
    """Compile one lowered HIP source, device code only, to an ARCH code object (linked with the device libraries);
    the kernels' registers, LDS and spills from clang's remarks."""
    with tempfile.TemporaryDirectory(prefix="kopt-wave64-") as tmp:
        work = Path(tmp)
        inc, libs, stubs = _stubs(tc, work, arch)
        src, obj = work / "kernel.hip", work / "kernel.hsaco"
        src.write_text(source)
        cmd = [tc.clang, "-x", "hip", f"--offload-arch={arch}", "--cuda-device-only", "--no-gpu-bundle-output", "-O3",
               "-std=c++17", f"--rocm-device-lib-path={libs}", "-Rpass-analysis=kernel-resource-usage", "-w",
               "-I", str(inc), "-I", str(tc.tl_include), "-c", str(src), "-o", str(obj)]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return HipCompile(False, stubs=stubs, log=f"timed out after {timeout_s:g} s")
        log = r.stdout + r.stderr
        ok = r.returncode == 0 and obj.is_file()
        return HipCompile(ok, obj.stat().st_size if ok else 0, _usage(log), stubs, log)


# ---------------------------------------------------------------- a candidate's plans, lowered and compiled

#: What a HIP source must not hold: CUDA's templates (red_once's prelude), inline PTX, Hopper's dependent launch.
CUDA_ONLY = ("tl_templates/cuda", "asm volatile", "griddepcontrol", "cudaGridDependencySynchronize", "cp.async")


@dataclass
class PlanCheck:
    """One plan of a device profile, lowered for HIP_TARGET and, with a toolchain, compiled for ARCH."""

    case: dict
    config: Optional[dict]
    plan: Optional[dict] = None
    """The candidate's device_plan for the case (None when the plan itself failed)."""
    error: str = ""
    """Why the plan or its lowering failed ("" when it lowered)."""
    smem: dict = field(default_factory=dict)
    """Kernel -> dynamic shared memory of its lowered source, bytes."""
    mfma: bool = False
    """The main kernel's QK^T and PV run on the matrix cores (MFMA builtins in its source)."""
    cuda_only: list[str] = field(default_factory=list)
    """CUDA_ONLY constructs found in the lowered sources."""
    compiled: dict = field(default_factory=dict)
    """Kernel -> HipCompile (absent when not compiled)."""
    not_compiled: str = ""
    """Why nothing was compiled ("" when it was)."""

    @property
    def lowered(self) -> bool:
        """Whether every kernel of the plan lowered."""
        return self.plan is not None and not self.error


_CANDIDATES: dict = {}


def load_candidate(path: str):
    """A candidate module loaded by path, once per process (its folder made importable by the module itself)."""
    mod = _CANDIDATES.get(path)
    if mod is None:
        import importlib.util

        from kopt.errors import CandidateLoadError

        if not Path(path).is_file():
            raise CandidateLoadError(f"candidate {path} not found")
        spec = importlib.util.spec_from_file_location(f"kopt_wave64_candidate_{len(_CANDIDATES)}", path)
        mod = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(mod)
        except Exception as e:  # the candidate's own code: any error it raises means it does not load
            raise CandidateLoadError(f"candidate {path} does not load: {type(e).__name__}: {e}") from None
        _CANDIDATES[path] = mod
    return mod


def check_plan(candidate: str, case: dict, profile: dict, config: Optional[dict] = None,
               compile_it: bool = True) -> PlanCheck:
    """Resolve a candidate's plan (its device_plan hook) for a case on a device profile, lower its kernels for
    HIP_TARGET (its lower_plan hook) and, where a toolchain is found and ``compile_it``, compile each for ARCH."""
    res = PlanCheck(case=dict(case), config=config)
    mod = load_candidate(str(candidate))
    if not hasattr(mod, "lower_plan"):
        res.error = "the candidate has no lower_plan hook"
        return res
    try:
        res.plan = mod.device_plan(case, profile, config)
        kernels = mod.lower_plan(case, profile, HIP_TARGET, config)["kernels"]
    except Exception as e:  # a plan or a lowering that fails is this check's result, named by its plan
        lines = str(e).strip().splitlines()
        res.error = f"{type(e).__name__}: {lines[-1] if lines else ''}"[:400]
        return res
    res.smem = {k: v["dyn_smem_bytes"] for k, v in kernels.items()}
    res.mfma = "__builtin_amdgcn_mfma" in kernels["main"]["source"]
    res.cuda_only = sorted({c for v in kernels.values() for c in CUDA_ONLY if c in v["source"]})
    tc, why = find_toolchain() if compile_it else (None, "not asked to compile")
    if tc is None:
        res.not_compiled = why
        return res
    res.compiled = {k: compile_source(v["source"], tc) for k, v in kernels.items()}
    return res


def check_plans(candidate: str, items: list[tuple[dict, Optional[dict]]], profile: dict, workers: int = 2,
                compile_it: bool = True) -> list[PlanCheck]:
    """check_plan for each (case, config), in `workers` processes (lowering is single-threaded CPU work)."""
    if workers <= 1 or len(items) <= 1:
        return [check_plan(candidate, c, profile, cfg, compile_it) for c, cfg in items]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futs = [pool.submit(check_plan, str(candidate), c, profile, cfg, compile_it) for c, cfg in items]
        return [f.result() for f in futs]


def as_dict(res: PlanCheck) -> dict:
    """A PlanCheck as plain data (JSON), compile logs cut to their last lines."""
    from dataclasses import asdict

    d = asdict(res)
    for c in d["compiled"].values():
        c["log"] = "\n".join(c["log"].splitlines()[-20:]) if not c["ok"] else ""
    d["lowered"] = res.lowered
    return d
