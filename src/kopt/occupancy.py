"""A plan's CUDA kernels as ptxas sees them, with no GPU: each kernel's registers and spills (nvcc -Xptxas -v on the
candidate's lowered source, its lower_plan hook) and how many of its CTAs fit on one unit (the arch's register file,
thread and CTA limits, the device profile's shared memory a unit). `kopt lab ab --registers` prints both for the two
candidates of an A/B, so a change that costs a unit a CTA is seen before it is timed. `canonical_source` is a lowered
source as two lowerings of the same kernel agree on it (`kopt lab ab --lowered` compares the two candidates' with it).

The limits are the CUDA occupancy calculator's for each compute capability; a unit keeps 1 KB of shared memory a CTA
for the system, and registers are allocated a warp at a time in blocks of 256. `fit` is the one rule of resident CTAs
(kopt.profile.geometry's estimate from a live device's properties uses it too)."""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass
from typing import Optional

_WORKSPACE_DECL = re.compile(r"^\s*void\* (workspace(?:_\d+)?) = (.*);\s*$", re.M)
_WORKSPACE_USE = re.compile(r"\bworkspace(?:_\d+)?\b")


#: a barrier the sync pass puts before a reduction on a workspace (the line, then the reduction's line ahead)
_REDUCTION_BARRIER = re.compile(r"^[ \t]*__syncthreads\(\);[ \t]*\n(?=[ \t]*tl::AllReduce<[^\n]*\bworkspace\b)", re.M)


def canonical_source(source: str, barriers: bool = True) -> str:
    """A lowered source with the reduction workspaces' declarations left out and each use named `workspace`.
    TileLang assigns a kernel's reduction workspaces their names and their shared-memory offsets in an order that
    changes from lowering to lowering (the same code lowered twice: the row max's workspace at offset 17920 and the
    row sum's at 17408, then the other way round); which of them a reduction gets does not change what it computes.
    Every other byte is kept, unless `barriers` is off: then the `__syncthreads()` the sync pass puts right before a
    reduction on a workspace is left out too. Where it goes follows those offsets (one MHA kernel lowered in seven
    fresh processes: six put it before the row max's reduction, one before the row sum's), so two lowerings of one
    kernel can differ there; a template's own barriers (the reductions' code in the source's prelude) stay."""
    out = _WORKSPACE_USE.sub("workspace", _WORKSPACE_DECL.sub("", source))
    return out if barriers else _REDUCTION_BARRIER.sub("", out)


@dataclass(frozen=True)
class ArchLimits:
    """One compute capability's per-unit limits."""

    registers: int
    threads: int
    ctas: int
    reg_block: int = 256
    smem_reserved: int = 1024


#: per compute capability (the arch's digits): sm_80 (A100), sm_86/89 (consumer Ampere/Ada), sm_90 (H100, H200)
LIMITS = {"80": ArchLimits(65536, 2048, 32), "86": ArchLimits(65536, 1536, 16), "89": ArchLimits(65536, 1536, 24),
          "90": ArchLimits(65536, 2048, 32)}


@dataclass(frozen=True)
class CudaKernel:
    """One entry function of a compiled source."""

    name: str
    registers: int
    spill_bytes: int


def _digits(arch: str) -> str:
    m = re.fullmatch(r"sm_(\d+)a?", arch)
    if not m:
        raise ValueError(f"not a CUDA arch: {arch!r} (e.g. sm_90a)")
    return m.group(1)


def parse_ptxas(log: str) -> list[CudaKernel]:
    """The entry functions of a `ptxas -v` log, in order: name, registers, spill stores + loads."""
    out = []
    for block in re.split(r"Compiling entry function '", log)[1:]:
        name = block.split("'", 1)[0]
        regs = re.search(r"Used (\d+) registers", block)
        spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", block)
        out.append(CudaKernel(name, int(regs.group(1)) if regs else 0,
                              int(spill.group(1)) + int(spill.group(2)) if spill else 0))
    return out


@functools.cache
def compile_source(source: str, arch: str) -> tuple[CudaKernel, ...]:
    """nvcc (TileLang's helper and include paths) compiles a lowered CUDA source to a cubin for `arch`; ptxas' -v
    report per entry function. nvcc's own error (a RuntimeError) where it fails. Once a source and arch a process:
    the two sides of an A/B often lower to the same source."""
    import tilelang
    from tilelang.contrib import nvcc

    sm = _digits(arch) + ("a" if arch.endswith("a") else "")
    records: list[str] = []

    class _Grab(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    grab, log = _Grab(level=logging.INFO), tilelang.logger
    level, handlers, propagate = log.level, list(log.handlers), log.propagate
    log.handlers[:] = [grab]  # the report is read here, not printed: TileLang's own handlers are set aside
    log.propagate = False
    log.setLevel(logging.INFO)
    try:
        nvcc.compile_cuda(source, "cubin", ["-gencode", f"arch=compute_{sm},code=sm_{sm}"],
                          options=nvcc.default_compile_options(["-std=c++20", "-w", "-Xptxas", "-v"]), verbose=True)
    finally:
        log.handlers[:] = handlers
        log.propagate = propagate
        log.setLevel(level)
    return tuple(parse_ptxas("\n".join(records)))


def fit(threads: int, registers: Optional[int], smem_bytes: Optional[int], *, unit_threads: int,
        unit_registers: Optional[int], unit_smem: Optional[int], max_ctas: int, reg_block: int = 1,
        smem_reserved: int = 0, warp: int = 32) -> tuple[int, str]:
    """How many CTAs of `threads` threads (rounded up to whole warps), `registers` a thread and `smem_bytes` of shared
    memory are resident on one unit, and the limit that binds: "threads", "CTAs", "registers" or "shared memory" (the
    first of them in that order on a tie). Registers are allocated a warp at a time in blocks of `reg_block` (1: no
    granularity); a unit keeps `smem_reserved` bytes a CTA. A limit with no figure (None or 0) is left out."""
    t = -(-threads // warp) * warp
    bounds = {"threads": unit_threads // t, "CTAs": max_ctas}
    if registers and unit_registers:
        per_warp = -(-registers * warp // reg_block) * reg_block
        bounds["registers"] = unit_registers // (per_warp * (t // warp))
    if smem_bytes and unit_smem:
        bounds["shared memory"] = unit_smem // (smem_bytes + smem_reserved)
    by = min(bounds, key=lambda k: bounds[k])
    return max(0, bounds[by]), by


def ctas_a_unit(registers: int, threads: int, smem_bytes: int, arch: str,
                smem_per_unit: Optional[int]) -> tuple[int, str]:
    """fit with `arch`'s limits (LIMITS: register allocation granularity, the shared memory a unit keeps a CTA) and
    the device profile's shared memory a unit. A ValueError for an arch without a table row."""
    lim = LIMITS.get(_digits(arch))
    if lim is None:
        raise ValueError(f"no occupancy limits for {arch} (known: {', '.join('sm_' + k for k in LIMITS)})")
    return fit(threads, registers, smem_bytes, unit_threads=lim.threads, unit_registers=lim.registers,
               unit_smem=smem_per_unit, max_ctas=lim.ctas, reg_block=lim.reg_block, smem_reserved=lim.smem_reserved)
