"""FlashInfer's batch decode through a small C build of its own kernels and scheduler, for hosts where the
`flashinfer` package cannot be installed.

`kopt lab flashinfer-build` compiles, from the pinned flashinfer-python wheel, what
`BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True)` runs on Hopper for fp16/bf16 (its scheduler
`PrefillPlan` and its FA2 batch-prefill paged kernels, split-KV merge included) into
libkopt_flashinfer.so with a plain C ABI. This module loads it with ctypes and keeps the wrapper's
plan/run split: `Decoder.plan` (host scheduler, workspaces; outside any timed call) and `Decoder.run`
(the kernels, on torch's current stream, so CUDA-graph capture sees them).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

#: Environment variable naming the library; default: .gpu-fi/libkopt_flashinfer.so in the workspace.
ENV_LIB = "KOPT_FLASHINFER_LIB"
DEFAULT_LIB = Path(".gpu-fi") / "libkopt_flashinfer.so"
#: The build of that library (package data; a standalone script that imports nothing of kopt): `kopt lab
#: flashinfer-build` runs it.
BUILD_SCRIPT = Path(__file__).resolve().parent / "flashinfer_build" / "build.py"
#: FlashInfer's wrapper allocates its int workspace (and a page-locked host twin) of 8 MiB (decode.py).
INT_WORKSPACE = 8 << 20
#: PrefillPlanInfo::ToVector's length (scheduler.cuh).
PLAN_INFO_LEN = 15
_DTYPE_TAG = {"float16": "f16", "bfloat16": "bf16", "fp16": "f16", "bf16": "bf16"}


def library_path() -> Path:
    """$KOPT_FLASHINFER_LIB, else the workspace's .gpu-fi/libkopt_flashinfer.so."""
    from kopt.paths import workspace

    env = os.environ.get(ENV_LIB)
    return Path(env) if env else workspace() / DEFAULT_LIB


def variant(dtype, head_dim: int) -> str:
    """The build's name for a (torch dtype, its name or kopt's fp16/bf16, head dim) pair, e.g. f16_d128."""
    name = str(dtype).removeprefix("torch.")
    return f"{_DTYPE_TAG.get(name, name)}_d{head_dim}"


@dataclass
class PlanArgs:
    """What FlashInfer's plan() takes for a decode batch (one query row per request)."""

    float_workspace: object       # device uint8 tensor
    int_workspace: object         # device uint8 tensor
    page_locked_workspace: object  # pinned host uint8 tensor, same size as int_workspace
    qo_indptr: object             # host int32 [B + 1]: 0, 1, ..., B
    kv_indptr: object             # host int32 [B + 1], in pages
    batch: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    device: int
    stream: int


@dataclass
class RunArgs:
    """What FlashInfer's paged run() takes (NHD layout, non-causal, no LSE)."""

    float_workspace: object
    int_workspace: object
    plan_info: list
    q: object                     # [B, Hq, D]
    k: object                     # [pages, page, Hkv, D]
    v: object
    qo_indptr: object             # device int32 [B + 1]
    kv_indptr: object             # device int32 [B + 1]
    kv_indices: object            # device int32 [indptr[-1]]
    last_page_len: object         # device int32 [B]
    out: object                   # [B, Hq, D], written
    sm_scale: float
    enable_pdl: bool
    device: int
    stream: int


@dataclass
class Library:
    """The loaded build: its FlashInfer version, the variants it holds, plan and run."""

    path: Path
    version: str
    variants: tuple
    cdll: Optional[object] = field(default=None, repr=False)

    @property
    def label(self) -> str:
        """What ran, for the panel: flashinfer-<its version>-capi."""
        return f"flashinfer-{self.version}-capi"

    def plan(self, a: PlanArgs) -> list:
        """FlashInfer's PrefillPlan on the host arrays; returns the plan info (15 integers)."""
        info = (ctypes.c_int64 * PLAN_INFO_LEN)()
        ws, iw, pw = a.float_workspace, a.int_workspace, a.page_locked_workspace
        self._check(self.cdll.kopt_fi_plan(
            _ptr(ws), ws.numel(), _ptr(iw), _ptr(pw), iw.numel(), _ptr(a.qo_indptr), _ptr(a.kv_indptr),
            a.batch, a.num_qo_heads, a.num_kv_heads, a.head_dim, a.page_size, 0, -1, 0, a.device,
            ctypes.c_void_p(a.stream), info))
        return list(info)

    def run(self, name: str, a: RunArgs) -> None:
        """One launch of the variant's kernels (and the split-KV merge when the plan split)."""
        fn = getattr(self.cdll, f"kopt_fi_run_{name}")
        info = (ctypes.c_int64 * PLAN_INFO_LEN)(*a.plan_info)
        ks, vs = ((ctypes.c_int64 * 4)(*t.stride()) for t in (a.k, a.v))
        self._check(fn(
            _ptr(a.float_workspace), _ptr(a.int_workspace), info, _ptr(a.q), a.q.stride(0), a.q.stride(1),
            _ptr(a.k), _ptr(a.v), ks, vs, _ptr(a.qo_indptr), _ptr(a.kv_indptr), _ptr(a.kv_indices),
            _ptr(a.last_page_len), _ptr(a.out), None, a.q.shape[0], a.q.shape[1], a.k.shape[2], a.k.shape[1],
            ctypes.c_double(a.sm_scale), int(a.enable_pdl), a.device, ctypes.c_void_p(a.stream)))

    def _check(self, rc: int) -> None:
        if rc != 0:
            raise RuntimeError(f"FlashInfer C build: {self.cdll.kopt_fi_last_error().decode(errors='replace')}")


def _ptr(t) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr())


def _bind(cdll) -> None:
    """ctypes signatures of the C ABI (flashinfer_build/kopt_fi_*.cu beside this module)."""
    vp, i64, i32, sz = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_size_t
    for name in ("kopt_fi_version", "kopt_fi_variants", "kopt_fi_last_error"):
        getattr(cdll, name).restype = ctypes.c_char_p
    cdll.kopt_fi_plan.restype = i32
    cdll.kopt_fi_plan.argtypes = [vp, sz, vp, vp, sz, vp, vp, i64, i64, i64, i64, i64, i32, i64, i32, i32, vp,
                                  ctypes.POINTER(i64)]
    for name in cdll.kopt_fi_variants().decode().split(","):
        fn = getattr(cdll, f"kopt_fi_run_{name}")
        fn.restype = i32
        fn.argtypes = [vp, vp, ctypes.POINTER(i64), vp, i64, i64, vp, vp, ctypes.POINTER(i64),
                       ctypes.POINTER(i64), vp, vp, vp, vp, vp, vp, i64, i64, i64, i64, ctypes.c_double, i32, i32,
                       vp]


_LOADED: dict = {}


def load(path: Optional[Path] = None) -> tuple[Optional[Library], str]:
    """(the library, "") when it loads, else (None, the reason); loaded once per path."""
    path = Path(path or library_path())
    if str(path) in _LOADED:
        return _LOADED[str(path)]
    if not path.is_file():
        got = None, f"no FlashInfer C build at {path} (set {ENV_LIB}; `kopt lab flashinfer-build` builds it)"
    else:
        try:
            cdll = ctypes.CDLL(str(path))
            _bind(cdll)
            lib = Library(path, cdll.kopt_fi_version().decode(), tuple(cdll.kopt_fi_variants().decode().split(",")),
                          cdll)
            got = lib, ""
        except (OSError, AttributeError) as e:
            got = None, f"FlashInfer C build at {path} does not load ({type(e).__name__}: {str(e)[:160]})"
    _LOADED[str(path)] = got
    return got


class Decoder:
    """BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=True) over the C build."""

    def __init__(self, lib: Library, float_workspace_bytes: int):
        self.lib, self.float_bytes = lib, float_workspace_bytes

    def plan(self, pages, num_qo_heads: int, num_kv_heads: int, head_dim: int, dtype, sm_scale=None):
        """Workspaces and FlashInfer's schedule for these pages (a hopper.FlashInferPages); returns run(q).
        PDL on, as FlashInfer's run() defaults to on sm_90; sm_scale None: 1/sqrt(head_dim), as FlashInfer."""
        import torch

        scale = float(sm_scale) if sm_scale is not None else head_dim ** -0.5
        for t in (pages.k, pages.v):
            if t.stride(-1) != 1:
                raise RuntimeError("FlashInfer's kernels need the head dim contiguous (stride 1)")

        dev = pages.k.device
        b = pages.last_page_len.shape[0]
        name = variant(dtype, head_dim)
        if name not in self.lib.variants:
            raise RuntimeError(f"{name} not in this FlashInfer C build ({', '.join(self.lib.variants)})")
        fw = torch.empty(self.float_bytes, dtype=torch.uint8, device=dev)
        iw = torch.empty(INT_WORKSPACE, dtype=torch.uint8, device=dev)
        pw = torch.empty(INT_WORKSPACE, dtype=torch.uint8, pin_memory=dev.type == "cuda")
        qo_indptr_h = torch.arange(b + 1, dtype=torch.int32)
        kv_indptr_h = pages.indptr.to("cpu", torch.int32).contiguous()
        index = dev.index if dev.index is not None else (torch.cuda.current_device() if dev.type == "cuda" else 0)
        stream = torch.cuda.current_stream(dev).cuda_stream if dev.type == "cuda" else 0
        info = self.lib.plan(PlanArgs(fw, iw, pw, qo_indptr_h, kv_indptr_h, b, num_qo_heads, num_kv_heads, head_dim,
                                      pages.page_size, index, stream))
        qo_indptr = qo_indptr_h.to(dev)

        def run(q):
            """q [B, Hq, D] -> out [B, Hq, D], launched on the current stream (read at call time)."""
            out = torch.empty(q.shape[:-1] + (pages.v.shape[-1],), dtype=q.dtype, device=q.device)
            s = torch.cuda.current_stream(q.device).cuda_stream if q.device.type == "cuda" else 0
            self.lib.run(name, RunArgs(fw, iw, info, q, pages.k, pages.v, qo_indptr, pages.indptr, pages.indices,
                                       pages.last_page_len, out, scale, True, index, s))
            return out

        run.page_locked_workspace = pw  # lives as long as the plan (the scheduler's copy came from it)
        return run
