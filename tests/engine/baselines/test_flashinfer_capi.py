"""FlashInfer through kopt's C build of it, on the CPU: the loader faked (no GPU library can run here), the
argument marshalling checked (pages, indptr / indices / last_page_len, strides, dtype and head-dim dispatch,
plan outside the call), the ctypes layer driven with a fake library object, and the NA reasons."""

import ctypes
import os
import sys
from pathlib import Path

import pytest

from kopt import baselines
from kopt.baselines import flashinfer_capi as capi
from kopt.baselines import hopper, torch_attention
from kopt.cases import load_cases
from kopt.eval import checks
from kopt.reference import reference
from kopt.workload import Workload, make_workload


def _case(i, **variant):
    return next(c for c in load_cases() if c.id == i).with_variant(**variant)


def _ok(out, w):
    return checks.check_output(out, reference(w), torch_attention(w), w.q).status.value == "ok"


class _FakeLib(capi.Library):
    """The C build as far as kopt sees it: plan() records, run() decodes the pages it is handed."""

    def __init__(self, variants=("f16_d64", "f16_d128", "bf16_d64", "bf16_d128")):
        super().__init__(Path("libkopt_flashinfer.so"), "0.7.2.post1", tuple(variants))
        self.plans, self.runs = [], []

    def plan(self, a):
        self.plans.append(a)
        return list(range(capi.PLAN_INFO_LEN))

    def run(self, name, a):
        import torch

        self.runs.append((name, a))
        page = a.k.shape[1]
        for i in range(a.q.shape[0]):
            pages = a.kv_indices[a.kv_indptr[i]:a.kv_indptr[i + 1]].long()
            n = (len(pages) - 1) * page + int(a.last_page_len[i])
            ki, vi = (x[pages].reshape(-1, *x.shape[2:])[:n] for x in (a.k, a.v))
            w = Workload(a.q[i:i + 1, None], ki[None], vi[None], torch.tensor([n], dtype=torch.int32), None,
                         a.sm_scale, 0)
            a.out[i] = torch_attention(w)[0, 0]


@pytest.fixture
def fake_lib(monkeypatch):
    lib = _FakeLib()
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # the package absent: the C build is used
    monkeypatch.setattr(capi, "load", lambda path=None: (lib, ""))
    monkeypatch.setattr(hopper, "_capability", lambda: (9, 0))
    return lib


@pytest.mark.parametrize("case_id,page,dtype,d", [(5, None, "bf16", 128), (8, None, "fp16", 64),
                                                  (5, 16, "fp16", 128), (3, 64, "bf16", 64)])
def test_capi_plans_outside_the_call_and_decodes(fake_lib, case_id, page, dtype, d):
    c = _case(case_id, page_size=page, seqlens="ragged", dtype=dtype, head_dim=d)
    w = make_workload(c, 6)
    b = baselines.pick(c, "cuda", "flashinfer")
    assert b.na is None and b.name == "flashinfer-0.7.2.post1-capi"
    call = b.bind(w)
    assert len(fake_lib.plans) == 1 and not fake_lib.runs  # planned in the preparation, nothing run
    out = call()
    assert len(fake_lib.plans) == 1 and len(fake_lib.runs) == 1
    assert out.shape == w.q.shape and out.dtype == w.q.dtype and _ok(out, w)
    pa = fake_lib.plans[0]
    name, ra = fake_lib.runs[0]
    assert name == capi.variant(dtype, d) == f"{'f16' if dtype == 'fp16' else 'bf16'}_d{d}"
    assert (pa.batch, pa.num_qo_heads, pa.num_kv_heads, pa.head_dim) == (c.batch, c.q_heads, c.kv_heads, d)
    assert pa.page_size == (page or hopper.contiguous_page(c.seqlen_k)) == ra.k.shape[1]
    assert pa.qo_indptr.tolist() == list(range(c.batch + 1)) and pa.kv_indptr.device.type == "cpu"
    assert pa.kv_indptr.tolist() == ra.kv_indptr.tolist() and int(ra.kv_indptr[-1]) == len(ra.kv_indices)
    lens = w.cache_seqlens.tolist()
    pages = [-(-n // pa.page_size) for n in lens]
    assert [int(x) for x in ra.kv_indptr.diff()] == pages
    assert ra.last_page_len.tolist() == [n - (p - 1) * pa.page_size for n, p in zip(lens, pages)]
    assert pa.float_workspace.numel() == hopper.FLASHINFER_WORKSPACE and pa.int_workspace.numel() == capi.INT_WORKSPACE
    assert ra.plan_info == list(range(capi.PLAN_INFO_LEN)) and ra.enable_pdl and ra.sm_scale == w.softmax_scale
    # no copies: q is the decode token's view, K / V the workload's own memory
    assert ra.q.data_ptr() == w.q.data_ptr() and ra.q.shape == (c.batch, c.q_heads, d)
    assert ra.k.data_ptr() == w.k_cache.data_ptr() and ra.v.data_ptr() == w.v_cache.data_ptr()
    if page:
        assert ra.k is w.k_cache and ra.kv_indices.tolist() == [
            t for row, p in zip(w.block_table.tolist(), pages) for t in row[:p]]


def test_contiguous_page_divides_the_rows():
    assert [hopper.contiguous_page(s) for s in (4096, 141, 362, 58966, 61519, 8, 1, 17)] == [16, 1, 2, 2, 1, 8, 1, 1]


def test_capi_na_reasons(fake_lib, monkeypatch):
    c = _case(7, head_dim=64)
    monkeypatch.setattr(fake_lib, "variants", ("f16_d128",))
    na = baselines.pick(c, "cuda", "flashinfer").na
    assert na == "fp16 head_dim 64 not in this FlashInfer C build (f16_d128)"
    monkeypatch.setattr(hopper, "_capability", lambda: (10, 0))
    assert "sm_90a; this device is sm_100" in baselines.pick(_case(7, head_dim=128), "cuda", "flashinfer").na
    assert baselines.pick(c, "cpu", "flashinfer").na == "needs CUDA"


def test_neither_package_nor_build_is_na_with_both_reasons(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    monkeypatch.setattr(capi, "_LOADED", {})
    monkeypatch.delenv(capi.ENV_LIB, raising=False)
    b = baselines.pick(_case(7), "cuda", "flashinfer")
    assert b.name == "flashinfer" and b.na.startswith("flashinfer not importable (")
    assert "no FlashInfer C build at" in b.na and capi.ENV_LIB in b.na and ".gpu-fi" in b.na
    bad = tmp_path / "libbroken.so"
    bad.write_bytes(b"not an ELF file")
    monkeypatch.setenv(capi.ENV_LIB, str(bad))
    assert "does not load (OSError" in baselines.pick(_case(7), "cuda", "flashinfer").na


def test_the_package_wins_over_the_build(monkeypatch):
    import types

    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace(__version__="0.7.2"))
    monkeypatch.setattr(capi, "load", lambda path=None: pytest.fail("the C build is only for a missing package"))
    assert "BatchDecodeWithPagedKVCacheWrapper" in baselines.pick(_case(7), "cuda", "flashinfer").na


class _FakeCdll:
    """The shared library's exported functions, recording what ctypes hands them."""

    def __init__(self):
        self.calls = []

    def kopt_fi_plan(self, *args):
        self.calls.append(("plan", args))
        info = args[-1]
        for i in range(capi.PLAN_INFO_LEN):
            info[i] = 100 + i
        return 0

    def kopt_fi_run_bf16_d64(self, *args):
        self.calls.append(("run", args))
        return 1

    def kopt_fi_last_error(self):
        return b"BatchPrefillWithPagedKVCache failed: invalid argument"


def test_library_marshals_pointers_strides_and_errors():
    import torch

    cd = _FakeCdll()
    lib = capi.Library(Path("x.so"), "0.7.2.post1", ("bf16_d64",), cd)
    c = _case(3, page_size=16, dtype="bf16", head_dim=64)
    w = make_workload(c, 1)
    p = hopper.flashinfer_pages(w)
    run = capi.Decoder(lib, 1 << 16).plan(p, c.q_heads, c.kv_heads, 64, w.q.dtype, None)
    _, a = cd.calls[0]
    assert a[1] == 1 << 16 and a[4] == capi.INT_WORKSPACE and a[7:12] == (c.batch, c.q_heads, c.kv_heads, 64, 16)
    assert a[12:15] == (0, -1, 0)  # no CUDA graph, FlashInfer's own split (fixed_split_size -1), split allowed
    with pytest.raises(RuntimeError, match="invalid argument"):
        run(w.q[:, 0])
    _, r = cd.calls[1]
    assert list(r[2]) == list(range(100, 100 + capi.PLAN_INFO_LEN))  # the plan info, handed back as is
    assert (r[4], r[5]) == (c.q_heads * 64, 64)  # q [B, Hq, D] strides of the [B, 1, Hq, D] view
    assert r[3].value == w.q.data_ptr() and r[6].value == w.k_cache.data_ptr() and r[7].value == w.v_cache.data_ptr()
    assert list(r[8]) == list(w.k_cache.stride()) == list(r[9]) and r[15] is None  # no LSE
    assert r[16:20] == (c.batch, c.q_heads, c.kv_heads, 16)
    assert r[20].value == pytest.approx(64 ** -0.5) and r[21] == 1  # sm_scale None: 1/sqrt(D); PDL on
    assert (r[11].value, r[12].value, r[13].value) == (p.indptr.data_ptr(), p.indices.data_ptr(),
                                                       p.last_page_len.data_ptr())
    assert isinstance(r[23], ctypes.c_void_p)
    assert torch.equal(p.indices, w.block_table[:, :2].flatten())  # 17 keys: two pages of 16 per sequence


@pytest.mark.skipif(not os.environ.get(capi.ENV_LIB) or not Path(os.environ.get(capi.ENV_LIB, "")).is_file(),
                    reason=f"{capi.ENV_LIB} names no built library")
def test_the_built_library_loads_and_names_its_variants():
    """The real build (where one is named): it loads without a GPU and says what it holds."""
    capi._LOADED.clear()
    lib, why = capi.load()
    assert lib is not None, why
    assert lib.version == "0.7.2.post1" and set(lib.variants) == {"f16_d64", "f16_d128", "bf16_d64", "bf16_d128"}
