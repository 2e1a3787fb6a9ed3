"""The C500's plans on a wave64 target (kopt.wave64): every plan class the C500 profile produces lowers for TileLang's
HIP target (gfx942, wave64) and, where Debian's HIP toolchain is installed (CI installs it), compiles for gfx942.

The C500 itself (MACA) is not reachable: PyPI's TileLang has no MACA backend and no MACA compiler is packaged.
What this proves and what it does not: knowledge/portability_cuda_to_maca.md, "What the wave64 check proves".
"""

from __future__ import annotations

import collections
import os
import sys
from pathlib import Path

import pytest

from kopt import hardware, wave64

pytest.importorskip("tilelang")

ROOT = Path(__file__).resolve().parents[2]
CANDIDATE = str(ROOT / "solution" / "tilelang" / "run_kernel.py")
C500 = hardware.profile("C500").model_dump()
UNIT_SMEM = C500["smem_per_unit_bytes"]

#: The sweep: (head_dim, page_size (0: contiguous), gqa, batch, seqlen_k, kv_heads, dtype, config). Chosen so that
#: the C500 rule gives every plan class at both head dims, every layout with a merge and with a direct plan, and every
#: GQA ratio 1-16 at both head dims (test_sweep_covers_every_plan_class checks that it still does).
SWEEP = [
    (128, 0, 8, 1, 1, 4, "fp16", None), (128, 16, 4, 16, 362, 8, "bf16", None),
    (128, 32, 1, 16, 141, 4, "fp16", None), (128, 64, 2, 64, 2048, 8, "fp16", None),
    (128, 256, 16, 16, 4096, 4, "bf16", None), (128, 0, 6, 1, 8192, 4, "fp16", None),
    (128, 16, 7, 1, 61519, 4, "fp16", None), (128, 32, 3, 8, 32768, 8, "bf16", None),
    (128, 64, 5, 8, 131072, 4, "fp16", None), (128, 256, 9, 1, 8192, 4, "fp16", {"last_cta": 1}),
    (128, 0, 10, 64, 2048, 8, "bf16", None), (128, 16, 11, 16, 4096, 4, "fp16", None),
    (128, 32, 12, 1, 8192, 4, "fp16", None), (128, 64, 13, 1, 1, 4, "bf16", None),
    (128, 256, 14, 8, 32768, 8, "fp16", None), (128, 0, 15, 16, 4096, 4, "fp16", None),
    (64, 16, 3, 1, 1, 4, "fp16", None), (64, 32, 5, 16, 362, 8, "bf16", None),
    (64, 64, 7, 16, 141, 4, "fp16", None), (64, 256, 1, 64, 2048, 8, "fp16", None),
    (64, 0, 9, 16, 4096, 4, "bf16", None), (64, 16, 11, 1, 8192, 4, "fp16", None),
    (64, 32, 13, 1, 61519, 4, "fp16", None), (64, 64, 2, 8, 32768, 8, "bf16", None),
    (64, 256, 15, 8, 131072, 4, "fp16", None), (64, 0, 6, 1, 8192, 4, "fp16", {"last_cta": 1}),
    (64, 16, 8, 8, 32768, 4, "bf16", None), (64, 0, 10, 16, 362, 4, "fp16", None),
    (64, 32, 4, 16, 4096, 4, "fp16", None), (64, 0, 12, 8, 32768, 8, "bf16", None),
    (64, 64, 14, 1, 61519, 4, "fp16", None), (64, 256, 16, 16, 4096, 4, "fp16", None),
    (128, 0, 8, 4, 90, 4, "fp16", None),  # a 65-96-key range: one 96-key tile (iteration 58), the widest at 64 KB
]
CLASSES = {"direct", "direct-eager", "direct-v_split", "split-last", "split-fused", "balanced", "balanced+combine"}
LAYOUTS = {0, 16, 32, 64, 256}


def _case(d, page, gqa, batch, seqlen_k, kv_heads, dtype, _config=None) -> dict:
    return {"batch": batch, "seqlen_k": seqlen_k, "kv_heads": kv_heads, "gqa": gqa, "head_dim": d, "dtype": dtype,
            "page_size": page or None}


def plan_class(p: dict) -> str:
    """A plan's class: its kernels, and for the direct kernel its eager start or V split."""
    k = p["kernels"][0]
    if k == "decode_direct":
        return "direct-v_split" if p["v_split"] > 1 else "direct-eager" if p["eager"] else "direct"
    return {"decode_split_last": "split-last", "decode_split_combine": "split-fused",
            "decode_balanced": "balanced" if p["last_cta"] else "balanced+combine"}[k]


def label(row) -> str:
    d, page, g, b, s, hkv, dt, cfg = row
    return (f"d{d} {'page' + str(page) if page else 'contig'} G{g} B{b} S{s} Hkv{hkv} {dt}"
            + (f" {cfg}" if cfg else ""))


@pytest.fixture(scope="module")
def rk():
    return wave64.load_candidate(CANDIDATE)


#: The sweep's check (lowered for gfx942 and, with the toolchain, compiled), as the test below asks for it: made once
#: a run, ahead of the tests in a background process where a second core is free (tests/kernel_builds.py).
SWEEP_CHECK = dict(candidate=CANDIDATE, items=[[_case(*row), row[-1]] for row in SWEEP], profile="C500", workers=2,
                   compile=wave64.find_toolchain()[0] is not None)
KERNEL_BUILDS = [("wave64", SWEEP_CHECK)]


@pytest.fixture(scope="module")
def builds():
    from conftest import BACKGROUND
    from kernel_builds import Builds

    return Builds(None, BACKGROUND.get("folder"), BACKGROUND.get("process"))


def test_sweep_covers_every_plan_class(rk):
    """The sweep's C500 plans hold every plan class at head dims 64 and 128, every layout (contiguous, 16/32/64/256-
    token pages) with a merge plan and with a direct one, every GQA ratio 1-16 at both head dims, and wide tiles (more
    than 64 keys): up to 192 at head dim 64; at 128 only a 96-key one (a one-tile range of 65-96 keys), the widest
    tile the C500's 64 KB holds there (widest_tile)."""
    cov = collections.defaultdict(set)
    for row in SWEEP:
        p = rk.device_plan(_case(*row), C500, row[-1])
        k, d = plan_class(p), row[0]
        cov["class", d].add(k)
        cov["layout", d].add(row[1])
        cov["layout", "direct" if k.startswith("direct") else "merge"].add(row[1])
        cov["gqa", d].add(row[2])
        cov["tile", d].add(p["block_N"])
    for d in (64, 128):
        assert cov["class", d] == CLASSES and cov["layout", d] == LAYOUTS and cov["gqa", d] == set(range(1, 17))
    assert cov["layout", "direct"] == cov["layout", "merge"] == LAYOUTS
    assert max(cov["tile", 128]) == 96 and {128, 192} <= cov["tile", 64]


def test_c500_plans_use_no_hopper_only_switch_and_fit_a_unit(rk):
    """Every bench case's C500 plan (contiguous and paged, head dims 64 and 128): no PDL, no red_once prelude (CUDA's
    template), no nvcc fast math, reductions one row a thread (wave64), threads whole waves, a CTA within the 64 KB a
    unit holds, the balanced grid sized for 104 units, and no tile wider than 64 keys at head dim 128."""
    from kopt.cases import load_cases

    for c in load_cases():
        for page in (None, 16, 32, 64, 256):
            for d in (64, 128):
                case = {**c.with_variant(head_dim=d, page_size=page or 0).shape_dict()}
                p = rk.device_plan(case, C500)
                where = f"case {c.id} d{d} page {page}: {p}"
                assert not (p["pdl"] or p["red_once"] or p["fast_math"]), where
                assert p["red_batch"] == 1 and p["threads"] % 64 == 0, where
                assert p["smem_bytes"] <= UNIT_SMEM and p["units"] == 104 and p["warp_size"] == 64, where
                assert p["balanced"] in (0, 104, 2 * 104), where  # one or BAL_CTAS_PER_SM CTAs a unit, 104 units
                assert d == 64 or p["block_N"] <= 64, where


def test_red_batch_2_is_never_chosen_at_wave64(rk):
    """red_batch 2 (two rows of a thread through one butterfly) does not lower at wave64, where a thread holds one row
    of the 16-row tile: the plan never picks it there, and asking for it is an error that says why. It is still the
    H200's default where it was (the H200 plans lower to the same sources: test_plan.test_h200_sources_are_unchanged).
    """
    case = _case(128, 0, 8, 16, 4096, 4, "fp16")
    assert rk.device_plan(case, C500)["red_batch"] == 1
    assert rk.device_plan(case, hardware.profile("H200").model_dump())["red_batch"] == 2
    with pytest.raises(ValueError, match="red_batch=2 on C500.*1 rows a thread holds at a warp of 64"):
        rk.device_plan(case, C500, {"red_batch": 2})
    for derived in ("red_once", "pdl"):  # the device's facts decide them: no config key can turn them on
        with pytest.raises(ValueError, match=f"unknown config keys \\['{derived}'\\]"):
            rk.device_plan(case, C500, {derived: 1})
    with pytest.raises(ValueError, match="block_N=128 needs about .* C500 has 65536"):
        rk.device_plan(case, C500, {"block_N": 128, "num_splits": 1})
    # why: TileLang's HIP layout gives a thread one row of the reduced tile (the error the issue met)
    cu = sys.modules["tl_decode_cuda"]
    with pytest.raises(Exception, match="batch=2 exceeds per-thread output element count N=1"):
        cu.lower_kernels(wave64.HIP_TARGET, **dict(split=True, red_batch=2))


def _toolchain_or_na():
    tc, why = wave64.find_toolchain()
    if tc is None:
        if os.environ.get("CI"):  # CI installs it (.ci/run): a missing toolchain there is a failure, not a skip
            pytest.fail(f"HIP toolchain missing in CI: {why}")
        print(f"\nwave64 compile: NA ({why})")
    return tc


def test_every_c500_plan_class_lowers_and_compiles_for_wave64(builds):
    """The sweep's plans, each lowered for HIP gfx942 (wave64) and compiled for gfx942: failures named by plan. Each
    main kernel runs QK^T and PV on the matrix cores (MFMA), holds no CUDA-only construct, and takes no more shared
    memory than the plan's own bound and the C500's 64 KB; the compiled kernels use no scratch memory. Registers
    spilled to AGPRs are printed, not failed: the combine's 64 splits a round trip (comb_unroll 64, plans of 48 splits
    or more, an H200 choice) take 129 VGPRs and spill about 45 on gfx942."""
    tc = _toolchain_or_na()
    assert SWEEP_CHECK["compile"] == (tc is not None)
    res = builds.get("wave64", **SWEEP_CHECK)     # wave64.check_plans(CANDIDATE, the sweep, C500, workers=2, ...)
    failed = {label(row): r.error for row, r in zip(SWEEP, res) if not r.lowered}
    assert not failed, f"plans that do not lower for wave64: {failed}"
    bad = {}
    for row, r in zip(SWEEP, res):
        why = ([] if r.mfma else ["no MFMA"]) + ([f"CUDA-only {r.cuda_only}"] if r.cuda_only else [])
        why += [f"{k} {v} B shared > {r.plan['smem_bytes']}" for k, v in r.smem.items()
                if k == "main" and v > min(r.plan["smem_bytes"], UNIT_SMEM)]
        for k, c in r.compiled.items():
            if not c.ok:
                why.append(f"{k} does not compile: {c.log.strip().splitlines()[-1:]}")
            why += [f"{u.name} uses {u.scratch_bytes} B of scratch" for u in c.kernels if u.scratch_bytes]
        if why:
            bad[label(row)] = why
    assert not bad, bad
    print("\nplan -> lowered (main shared bytes) -> compiled gfx942 (VGPRs+AGPRs, registers spilled, occupancy)")
    for row, r in zip(SWEEP, res):
        comp = "NA" if not r.compiled else "; ".join(
            f"{u.name.removesuffix('_kernel')} {u.vgprs}+{u.agprs} spill {u.spills} occ {u.occupancy}"
            for c in r.compiled.values() for u in c.kernels)
        print(f"{label(row):40s} {plan_class(r.plan):17s} {r.smem['main']:6d}  {comp}")
    if tc is not None:
        assert all(r.compiled and all(c.ok for c in r.compiled.values()) for r in res)
        stubs = {s for r in res for c in r.compiled.values() for s in c.stubs}
        print("stubbed for the compile:", sorted(stubs) or "nothing")


def test_portability_notes_name_the_switches_and_the_sweep():
    """knowledge/portability_cuda_to_maca.md's table of the switches that need the device's own backend is
    kopt.doctor.HOPPER_ONLY (each off in every C500 plan: test_c500_plans_use_no_hopper_only_switch_and_fit_a_unit), and
    the number of shapes it says the wave64 check takes is this module's sweep."""
    import re

    from kopt.doctor import HOPPER_ONLY

    doc = (ROOT / "knowledge" / "portability_cuda_to_maca.md").read_text()
    table = doc.split("<!-- wave64-switches")[1].split("<!-- /wave64-switches -->")[0]
    assert re.findall(r"^\| `(\w+)` \|", table, re.M) == list(HOPPER_ONLY)
    assert f"takes {len(SWEEP)} shapes" in doc


def test_resource_remarks_and_stubs(tmp_path):
    """clang's kernel-resource-usage remarks become one KernelUsage a kernel; a stub is made only for what the install
    lacks (HIP 5.2 here: bf16 header, rocWMMA, TileLang's fp8 debug header, gfx942's ISA-version bitcode), and none
    where a newer ROCm has them all."""
    log = "\n".join(f"k.hip:10:1: remark: {x} [-Rpass-analysis=kernel-resource-usage]" for x in (
        "Function Name: decode_kernel", "    SGPRs: 47", "    VGPRs: 104", "    AGPRs: 24",
        "    ScratchSize [bytes/lane]: 0", "    Occupancy [waves/SIMD]: 4", "    SGPRs Spill: 0", "    VGPRs Spill: 3",
        "    LDS Size [bytes/block]: 0", "Function Name: combine_kernel", "    VGPRs: 57",
        "    Occupancy [waves/SIMD]: 8"))
    u = wave64._usage(log)
    assert [(k.name, k.vgprs, k.agprs, k.sgprs, k.spills, k.occupancy) for k in u] == [
        ("decode_kernel", 104, 24, 47, 3, 4), ("combine_kernel", 57, 0, 0, 0, 8)]

    def toolchain(*headers, isa=("940",)):
        inc, libs = tmp_path / "inc", tmp_path / "libs"
        for h in ("hip/hip_runtime.h", *headers):
            (inc / h).parent.mkdir(parents=True, exist_ok=True)
            (inc / h).write_text("")
        libs.mkdir(exist_ok=True)
        for v in isa:
            (libs / f"oclc_isa_version_{v}.bc").write_bytes(b"")
        return wave64.Toolchain("clang++", libs, inc, tmp_path)

    work = tmp_path / "w1"
    work.mkdir()
    inc, libs, made = wave64._stubs(toolchain(), work, "gfx942")
    assert made == ["hip/hip_bf16.h", "rocwmma/rocwmma.hpp", "tl_templates/hip/debug.h",
                    "oclc_isa_version_942.bc (gfx940's)"]
    assert "hip_bfloat16.h" in (inc / "hip/hip_bf16.h").read_text() and (libs / "oclc_isa_version_942.bc").exists()
    work = tmp_path / "w2"
    work.mkdir()
    tc = toolchain("hip/hip_bf16.h", "rocwmma/rocwmma.hpp", "hip/amd_detail/amd_hip_fp8.h", isa=("940", "942"))
    assert wave64._stubs(tc, work, "gfx942")[2] == []
