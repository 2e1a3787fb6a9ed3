"""The read bound's kernels read every byte they claim (GPU only): their per-program sums add up to the data's."""
import pytest

from kopt import roofline


def test_check_read_sum_catches_a_read_that_skipped_bytes():
    import torch

    data = torch.arange(1000, dtype=torch.float32)
    whole = torch.stack([data[:500].sum(), data[500:].sum()])
    roofline.check_read_sum(whole, data)
    with pytest.raises(RuntimeError, match="did not read every byte"):
        roofline.check_read_sum(whole[:1], data)


@pytest.mark.gpu
def test_read_span_reads_the_bytes():
    ms, name, fn = roofline.read_span_ms("cuda", 3 << 20, quick=True)  # each variant checks its sum
    assert ms > 0 and "triton read" in name
    fn()


@pytest.mark.gpu
@pytest.mark.parametrize("page", [0, 16])
def test_tile_and_shaped_reads_read_every_valid_key(page):
    from kopt.cases import load_cases, select
    from kopt.lab import reads as rb
    from kopt.workload import make_workload

    (case,) = select(load_cases(), [18])  # ragged: a long row and three of 17 keys
    w = make_workload(case.with_variant(page_size=page), 3, "cuda")
    for fn, sink, _ in rb.tile_read(w)[:1]:
        sink.zero_()
        fn()
        roofline.check_read_sum(sink, *rb.valid_kv(w))
    if not page:
        (full,) = select(load_cases(), [10])
        w = make_workload(full, 3, "cuda")
        for hm in (False, True):
            for fn, sink, _ in rb.shaped_read(w, 128, 32, head_major=hm)[:2]:
                fn()
                roofline.check_read_sum(sink, w.k_cache, w.v_cache)
