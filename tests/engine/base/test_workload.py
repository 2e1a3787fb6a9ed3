"""Workloads: seeded, paged == contiguous, ragged lengths; and the reference against an independent computation."""

import pytest
import torch

from kopt.cases import load_cases, select
from kopt.reference import reference
from kopt.workload import bytes_moved, make_workload


def _case(i, **v):
    return select(load_cases(), [i])[0].with_variant(**v)


@pytest.mark.parametrize("page", [16, 32, 64, 256])
@pytest.mark.parametrize("seqlens", ["full", "ragged"])
def test_paged_holds_same_logical_cache(page, seqlens):
    c = _case(3, seqlens=seqlens)
    contig = make_workload(c, seed=5)
    paged = make_workload(c.with_variant(page_size=page), seed=5)
    assert paged.block_table.dtype == torch.int32 and paged.k_cache.shape[1] == page
    assert sorted(paged.block_table.flatten().tolist()) == list(range(paged.k_cache.shape[0]))
    k, v = paged.logical_kv()
    s = c.seqlen_k
    assert torch.equal(k[:, :s], contig.k_cache) and torch.equal(v[:, :s], contig.v_cache)
    assert torch.equal(paged.q, contig.q) and torch.equal(paged.cache_seqlens, contig.cache_seqlens)


def test_seeded_and_fresh():
    c = _case(2)
    a, b, d = make_workload(c, 1), make_workload(c, 1), make_workload(c, 2)
    assert torch.equal(a.q, b.q) and not torch.equal(a.q, d.q)


def test_ragged_lengths_in_range():
    c = _case(3, seqlens="ragged")
    lens = make_workload(c, 3).cache_seqlens
    assert lens.dtype == torch.int32 and lens.shape == (16,)
    assert int(lens.min()) >= 1 and int(lens.max()) == 17 and len(set(lens.tolist())) > 1


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_reference_matches_independent_sdpa(dtype):
    c = _case(3, seqlens="ragged", dtype=dtype, page_size=16)
    w = make_workload(c, 11)
    ref = reference(w)
    k, v = w.logical_kv()
    g = c.gqa
    for i in range(c.batch):
        n = int(w.cache_seqlens[i])
        q = w.q[i, 0].double()[:, None, :]                          # [Hq, 1, D]
        kk = k[i, :n].double().transpose(0, 1).repeat_interleave(g, 0)  # [Hq, n, D]
        vv = v[i, :n].double().transpose(0, 1).repeat_interleave(g, 0)
        o = torch.nn.functional.scaled_dot_product_attention(q, kk, vv, scale=w.softmax_scale)
        assert torch.allclose(ref[i, 0].double(), o[:, 0], atol=1e-5, rtol=1e-5)


def test_bytes_moved():
    c = _case(10)
    assert bytes_moved(c) == 2 * 8192 * 4 * 128 * 2 + 2 * 32 * 128 * 2
