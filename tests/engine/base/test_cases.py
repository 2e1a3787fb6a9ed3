"""Case loader, selection and variant validation."""

import pytest

from kopt.cases import DType, load_cases, select
from kopt.errors import CaseError

SEED_C500 = [0.036, 0.035, 0.042, 0.050, 0.043, 0.048, 0.302, 0.105, 0.316, 0.062, 0.244, 0.595, 0.212, 0.162]


def test_fourteen_cases_with_fixed_ids():
    cases = [c for c in load_cases() if c.kind in ("edge", "perf")]
    assert [c.id for c in cases] == list(range(1, 15))
    c10 = select(cases, [10])[0]
    assert (c10.batch, c10.seqlen_k, c10.kv_heads, c10.gqa, c10.q_heads) == (1, 8192, 4, 8, 32)
    assert [c.c500_ref_ms for c in cases] == SEED_C500
    assert {c.kind for c in cases[:3]} == {"edge"} and {c.kind for c in cases[3:]} == {"perf"}
    assert all(c.variant.head_dim == 128 and c.variant.dtype == DType.fp16 for c in cases)


def test_seed_cases_have_their_own_variants_over_the_defaults():
    by_id = {c.id: c for c in load_cases()}
    assert [i for i, c in by_id.items() if c.kind == "seed"] == [19, 20, 21]
    for i in (19, 20):
        c = by_id[i]
        assert (c.q_heads, c.kv_heads, c.seqlen_k, c.variant.head_dim, c.variant.dtype, c.variant.page_size) == \
            (32, 4, 1536, 64, DType.bf16, 256)
    assert (by_id[21].q_heads, by_id[21].kv_heads, by_id[21].variant.head_dim) == (16, 1, 128)
    assert by_id[21].variant.dtype == DType.fp16, "fields a case does not set come from the file's defaults"


def test_ragged_cases_carry_their_lengths():
    by_id = {c.id: c for c in load_cases()}
    assert [i for i, c in by_id.items() if c.kind == "ragged"] == [15, 16, 17, 18]
    assert by_id[15].seq_lengths() == [32768] + [512] * 15
    assert by_id[17].seq_lengths() == [1024 * 2 ** i for i in range(8)]
    assert by_id[18].valid_keys == 61519 + 3 * 17
    r2 = by_id[16].seq_lengths()
    assert len(r2) == 64 and min(r2) >= 1 and max(r2) <= 8192 and r2 == by_id[16].seq_lengths()
    assert by_id[10].seq_lengths() is None and by_id[10].valid_keys == 8192


@pytest.mark.parametrize("entry, msg", [
    ("lengths: [5, 5]", "lengths has 2 entries, batch is 3"),
    ("lengths: [5, 5, 99]", "exceeds seqlen_k"),
    ("lengths: [5, 0, 5]", "greater than 0"),
    ("lengths: {uniform: [9, 3]}", "lo <= hi"),
    ("lengths: {uniform: [1, 5], sed: 1}", "Extra inputs"),
    ("", "ragged case needs lengths"),
])
def test_bad_ragged_lengths_are_clear_errors(tmp_path, entry, msg):
    from kopt.cases import load_file

    sep = ", " if entry else ""
    f = tmp_path / "cases.yaml"
    f.write_text("cases:\n  - {id: 1, batch: 3, seqlen_k: 10, kv_heads: 1, gqa: 1, kind: ragged" + sep + entry + "}\n")
    with pytest.raises(CaseError, match=msg):
        load_file(f)


def test_bad_lengths_exit_2_from_the_cli(workspace):
    from conftest import kopt

    (workspace / "bench" / "cases.yaml").write_text(
        "cases:\n  - {id: 1, batch: 2, seqlen_k: 10, kv_heads: 1, gqa: 1, kind: ragged, lengths: [3]}\n")
    r = kopt("bench", "--case", "1", "--device", "cpu")
    assert r.exit_code == 2 and "lengths has 1 entries, batch is 2" in r.output


def test_unknown_case_lists_valid_ids():
    with pytest.raises(CaseError, match=r"unknown case id 99; valid ids: 1, 2, .*14"):
        select(load_cases(), [99])


def test_variant_overrides_and_errors():
    c = load_cases()[0].with_variant(dtype="bf16", page_size=64, seqlens="ragged", head_dim=64)
    assert c.variant.label() == "bf16-d64-paged64-ragged"
    assert c.with_variant(page_size=0).variant.page_size is None
    with pytest.raises(CaseError, match="dtype"):
        c.with_variant(dtype="fp8")
    with pytest.raises(CaseError, match="page_size"):
        c.with_variant(page_size=48)


@pytest.mark.parametrize("text,match", [
    ("cases: [", "not valid YAML at line 1, column 9: expected the node content"),
    ("cases:\n\t- {id: 1}", r"not valid YAML at line 2, column 1: found character '\\t'"),
    ("- 1\n- 2", "expected a mapping"),
    ("cases: []", "at least one case"),
    ("cases:\n  - {id: 1, batch: 0, seqlen_k: 1, kv_heads: 1, gqa: 1, kind: edge}", "batch"),
    ("cases:\n  - {id: 1, batch: 1, seqlen_k: 1, kv_heads: 1, gqa: 1, kind: edge}\n"
     "  - {id: 1, batch: 1, seqlen_k: 1, kv_heads: 1, gqa: 1, kind: edge}", "unique"),
    ("defaults: {dtype: fp64}\ncases:\n  - {id: 1, batch: 1, seqlen_k: 1, kv_heads: 1, gqa: 1, kind: edge}", "dtype"),
])
def test_malformed_case_files(tmp_path, text, match):
    f = tmp_path / "cases.yaml"
    f.write_text(text)
    with pytest.raises(CaseError, match=match):
        load_cases(f)


def test_missing_case_file(tmp_path):
    with pytest.raises(CaseError, match="not found"):
        load_cases(tmp_path / "nope.yaml")
