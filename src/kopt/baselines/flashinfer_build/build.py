#!/usr/bin/env python3
"""Build libkopt_flashinfer.so: FlashInfer's own batch-decode kernels and scheduler (the tensor-core path
BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True) takes, i.e. its FA2 batch-prefill kernels), for
sm_90a, behind a plain C ABI that kopt loads with ctypes (kopt.baselines.flashinfer_capi).

Sources: the pinned flashinfer-python wheel (its data/include headers and two data/csrc templates), or the
trimmed source tarball a previous build wrote beside the library (for a rebuild on a host without network).
Nothing of FlashInfer is committed: this script takes it from the wheel, renders FlashInfer's templates as its
JIT renders them (flashinfer/jit/attention/modules.py, gen_customize_batch_prefill_module, backend fa2), and
compiles them with the flags its JIT uses, plus kopt's two glue files beside this script.

    kopt lab flashinfer-build                       # pip download the pinned wheel, build into .gpu-fi/
    kopt lab flashinfer-build --wheel flashinfer_python-0.7.2.post1-py3-none-any.whl
    kopt lab flashinfer-build --src .gpu-fi/flashinfer-0.7.2.post1-capi-src.tar.xz --out /tmp/kopt-fi

(`kopt lab flashinfer-build` runs this file, which kopt ships as package data: it imports nothing of kopt.)

Needs nvcc (CUDA >= 12.8; built and tested with 13.0), a host C++17 compiler and jinja2; no GPU, no torch.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

VERSION = "0.7.2.post1"
WHEEL = f"flashinfer_python-{VERSION}-py3-none-any.whl"
WHEEL_SHA256 = "bfdc18b9e1e4d8d0730fe4343dc0e284cd0c160086de80f99888bc4867922d49"
LIB = "libkopt_flashinfer.so"
SRC_TARBALL = f"flashinfer-{VERSION}-capi-src.tar.xz"
HERE = Path(__file__).resolve().parent
#: (suffix, FlashInfer dtype name, head dim): what kopt's cases use (fp16/bf16, head dims 64 and 128).
VARIANTS = [(f"{t}_d{d}", name, d) for t, name in (("f16", "half"), ("bf16", "nv_bfloat16")) for d in (64, 128)]
#: The two templates of the wheel's data/csrc the fa2 batch-prefill JIT renders.
TEMPLATES = ("batch_prefill_customize_config.jinja", "batch_prefill_paged_kernel_inst.jinja")
#: The vendored CCCL FlashInfer's JIT puts first on the include path (jit/env.py CCCL_INCLUDE_DIRS): its headers
#: need a newer libcu++ than the CUDA toolkit's (cuda::fast_mod_div).
CCCL = ("cccl/cub/", "cccl/libcudacxx/include/", "cccl/thrust/")
#: FlashInfer's JIT flags for this module on sm_90 (jit/core.py gen_jit_spec, jit/cpp_ext.py build_cuda_cflags,
#: compilation_context.py: 9.0 -> compute_90a; common flags FP8_E8M0 / FP4_E2M1), release build.
NVCC_FLAGS = ["-std=c++17", "-use_fast_math", "-Xfatbin=-compress-all", "--compress-mode=size",
              "-DFLASHINFER_ENABLE_F16", "-DFLASHINFER_ENABLE_BF16", "-DFLASHINFER_ENABLE_FP8_E4M3",
              "-DFLASHINFER_ENABLE_FP8_E5M2", "-DFLASHINFER_ENABLE_FP8_E8M0", "-DFLASHINFER_ENABLE_FP4_E2M1",
              "-DNDEBUG", "-O3", "--compiler-options=-fPIC", "--expt-relaxed-constexpr",
              "-gencode=arch=compute_90a,code=sm_90a"]
#: kopt's own additions: only the C ABI is exported (each variant's FlashInfer symbols stay inside).
KOPT_FLAGS = ["-Xcompiler=-fvisibility=hidden", "-Xcompiler=-fvisibility-inlines-hidden"]

# The fa2 module's additional parameters (modules.py _gen_batch_prefill_module, backend fa2): their declarations
# are fields of the params structs, so they are rendered exactly; the function-parameter and setter macros are
# only used by the tvm-ffi binding, which this build replaces, and are rendered empty.
_TENSORS = [("uint8_t", "maybe_custom_mask"), ("int32_t", "maybe_mask_indptr"), ("float", "maybe_alibi_slopes"),
            ("uint32_t", "maybe_prefix_len_ptr"), ("uint16_t", "maybe_token_pos_in_items_ptr"),
            ("uint16_t", "maybe_max_item_len_ptr"), ("uint8_t", "maybe_k_cache_sf"), ("uint8_t", "maybe_v_cache_sf")]
_SCALARS = [("double", "logits_soft_cap"), ("double", "sm_scale"), ("double", "rope_rcp_scale"),
            ("double", "rope_rcp_theta"), ("int64_t", "token_pos_in_items_len")]


README = """# FlashInfer {flashinfer}'s batch decode for kopt's `flashinfer` peer (no flashinfer package needed)

- `{library}` ({mb:.2f} MB): FlashInfer's own scheduler and FA2 batch-prefill paged kernels (what
  `BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True)` runs for fp16/bf16), sm_90a only, variants
  {variants}, behind a C ABI; the CUDA runtime, libstdc++ and libgcc are linked in statically (the host needs
  glibc >= 2.35 and a driver for CUDA 13).
- `{src_tarball}`: the FlashInfer files that build read (headers, the vendored CCCL headers, two templates),
  for a rebuild where no wheel can be downloaded.
- `BUILD.json`: where it came from ({from}), nvcc, flags, sizes, hashes.

Built by `kopt lab flashinfer-build` (see results/peers-flashinfer.md). kopt finds the library here
(`.gpu-fi/` in the workspace) or where `KOPT_FLASHINFER_LIB` says; `kopt peers --peers flashinfer` then labels
the peer `flashinfer-{flashinfer}-capi`. Check it on a GPU with `kopt lab flashinfer`;
rebuild it there with `kopt lab flashinfer-build --src .gpu-fi/{src_tarball} --out DIR`.
"""


def log(msg: str) -> None:
    print(f"[build] {msg}", file=sys.stderr, flush=True)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_wheel(dest: Path) -> Path:
    """The pinned wheel, downloaded with pip (no dependencies) unless already there; its hash checked."""
    wheel = dest / WHEEL
    if not wheel.is_file():
        dest.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                        f"flashinfer-python=={VERSION}", "-d", str(dest)], check=True)
    return wheel


def unpack_wheel(wheel: Path, fi: Path) -> None:
    """data/include/**, the vendored CCCL and the two templates of the wheel into fi/."""
    got = sha256(wheel)
    if got != WHEEL_SHA256:
        raise SystemExit(f"{wheel}: sha256 {got}, expected {WHEEL_SHA256} (flashinfer-python {VERSION})")
    prefix = "flashinfer/data/"
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if not name.startswith(prefix) or name.endswith("/"):
                continue
            rel = name[len(prefix):]
            if rel.startswith(("include/", *CCCL)) or rel in (f"csrc/{t}" for t in TEMPLATES):
                out = fi / rel
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(z.read(name))


def render(fi: Path, gen: Path, dtype: str, head_dim: int) -> None:
    """FlashInfer's config and paged-kernel instantiation for one variant, rendered as its fa2 JIT does
    (dtype_q = dtype_kv = dtype_o, int32 indices, pos encoding NONE, no window, no soft cap, no fp16 QK
    reduction, equal K/V strides) for the one mask decode uses (non-causal)."""
    import jinja2

    decl = "".join(f"{t}* {n};\n" for t, n in _TENSORS) + "".join(f"{t} {n};\n" for t, n in _SCALARS)
    kw = dict(variant_decl="#include<flashinfer/attention/variants.cuh>",
              variant_name="DefaultAttention<use_custom_mask, false, false, false>",
              dtype_q=dtype, dtype_kv=dtype, dtype_o=dtype, idtype="int32_t", require_fp4_kv_cache=False,
              head_dim_qk=head_dim, head_dim_vo=head_dim, pos_encoding_mode="PosEncodingMode::kNone",
              use_sliding_window="false", use_logits_soft_cap="false", use_fp16_qk_reduction="false",
              paged_kv_stride_mode="equal", same_kv_strides_values=["true"], additional_params_decl=decl,
              additional_func_params="", additional_params_setter="")
    gen.mkdir(parents=True, exist_ok=True)
    cfg, inst = (jinja2.Template((fi / "csrc" / t).read_text()) for t in TEMPLATES)
    (gen / "batch_prefill_config.inc").write_text(cfg.render(**kw))
    (gen / "batch_prefill_paged_kernel_mask_0.cu").write_text(inst.render(mask_mode="MaskMode::kNone", **kw))


def nvcc() -> str:
    for cand in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and Path(cand).is_file():
            return cand
    raise SystemExit("nvcc not found (set NVCC=/path/to/nvcc)")


def compile_all(fi: Path, build: Path, jobs: int) -> list[Path]:
    """One object per variant plus the plan/common object, compiled in parallel; dependency files beside them."""
    variants = ",".join(s for s, _, _ in VARIANTS)
    base = [nvcc(), *NVCC_FLAGS, *KOPT_FLAGS, *(f"-I{fi / c}" for c in CCCL), f"-I{fi / 'include'}", f"-I{HERE}"]
    cmds = [(build / "common.o", base + [f'-DKOPT_FI_VERSION="{VERSION}"', f'-DKOPT_FI_VARIANTS="{variants}"',
                                         "-c", str(HERE / "kopt_fi_common.cu")])]
    for suffix, _, _ in VARIANTS:
        cmds.append((build / f"{suffix}.o", base + [f"-I{build / 'gen' / suffix}", f"-DKOPT_FI_SUFFIX={suffix}",
                                                    "-c", str(HERE / "kopt_fi_variant.cu")]))

    def run(obj_cmd):
        obj, cmd = obj_cmd
        cmd = cmd + ["-o", str(obj), "--generate-dependencies-with-compile", "-MF", str(obj.with_suffix(".d"))]
        log(f"nvcc -> {obj.name}")
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"nvcc failed for {obj.name}:\n{' '.join(cmd)}\n{r.stdout}{r.stderr}")
        return obj

    with concurrent.futures.ThreadPoolExecutor(max(1, jobs)) as pool:
        return list(pool.map(run, cmds))


def link(objs: list[Path], out: Path) -> None:
    """A shared library with the CUDA runtime, libstdc++ and libgcc linked in statically (the host needs only
    the driver), stripped."""
    cmd = [nvcc(), "-shared", "-cudart", "static", "-gencode=arch=compute_90a,code=sm_90a", *map(str, objs),
           "-Xcompiler=-static-libstdc++", "-Xcompiler=-static-libgcc", "-Xlinker=--exclude-libs,ALL",
           "-o", str(out)]
    subprocess.run(cmd, check=True)
    subprocess.run(["strip", "--strip-unneeded", str(out)], check=True)


def used_sources(build: Path, fi: Path) -> list[Path]:
    """The FlashInfer files the compile read (from nvcc's dependency files), plus the two templates."""
    used = {fi / "csrc" / t for t in TEMPLATES}
    for d in build.glob("*.d"):
        for tok in re.split(r"\s+", d.read_text().replace("\\\n", " ")):
            p = Path(tok.rstrip(":"))
            if p.is_absolute() and p.is_file() and fi in p.resolve().parents:
                used.add(p.resolve())
    return sorted(used)


def write_src_tarball(files: list[Path], fi: Path, out: Path) -> None:
    with tarfile.open(out, "w:xz", preset=9) as tar:
        for f in files:
            info = tar.gettarinfo(str(f), arcname=str(f.relative_to(fi)))
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            with open(f, "rb") as fh:
                tar.addfile(info, fh)


def nvcc_version() -> str:
    r = subprocess.run([nvcc(), "--version"], capture_output=True, text=True)
    return (r.stdout.strip().splitlines() or ["?"])[-1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--wheel", type=Path, help=f"the {WHEEL} to take FlashInfer from (default: pip download it)")
    src.add_argument("--src", type=Path, help=f"a {SRC_TARBALL} written by an earlier build")
    ap.add_argument("--out", type=Path, default=Path(".gpu-fi"), help="where the library goes (default .gpu-fi/ here)")
    ap.add_argument("--build-dir", type=Path, default=Path("build") / "flashinfer-capi",
                    help="scratch folder for the build (default build/flashinfer-capi here)")
    ap.add_argument("--jobs", type=int, default=min(5, os.cpu_count() or 1))
    ap.add_argument("--no-src-tarball", action="store_true", help="do not write the trimmed source tarball")
    a = ap.parse_args(argv)

    build = a.build_dir.resolve()
    fi = build / "fi"
    shutil.rmtree(build / "gen", ignore_errors=True)
    shutil.rmtree(fi, ignore_errors=True)
    fi.mkdir(parents=True)
    if a.src:
        with tarfile.open(a.src) as tar:
            tar.extractall(fi, filter="data") if sys.version_info >= (3, 12) else tar.extractall(fi)
        origin = f"{a.src.name} (sha256 {sha256(a.src)})"
    else:
        wheel = a.wheel or fetch_wheel(build / "dl")
        unpack_wheel(wheel, fi)
        origin = f"{WHEEL} (sha256 {WHEEL_SHA256})"
    for suffix, dtype, d in VARIANTS:
        render(fi, build / "gen" / suffix, dtype, d)
    objs = compile_all(fi, build, a.jobs)
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    lib = out / LIB
    link(objs, lib)
    manifest = {"flashinfer": VERSION, "from": origin, "variants": [s for s, _, _ in VARIANTS],
                "nvcc": nvcc_version(), "nvcc_flags": NVCC_FLAGS + KOPT_FLAGS, "library": LIB,
                "library_bytes": lib.stat().st_size, "library_sha256": sha256(lib)}
    if not a.no_src_tarball:
        files = used_sources(build, fi)
        write_src_tarball(files, fi, out / SRC_TARBALL)
        manifest |= {"src_tarball": SRC_TARBALL, "src_files": len(files),
                     "src_tarball_bytes": (out / SRC_TARBALL).stat().st_size}
    (out / "BUILD.json").write_text(json.dumps(manifest, indent=1) + "\n")
    (out / "README.md").write_text(README.format(**(manifest | {"variants": ", ".join(manifest["variants"]),
                                                                 "src_tarball": SRC_TARBALL}),
                                                 mb=manifest["library_bytes"] / 1e6))
    log(f"wrote {lib} ({lib.stat().st_size / 1e6:.2f} MB)")
    print(lib)
    return 0


if __name__ == "__main__":
    sys.exit(main())
