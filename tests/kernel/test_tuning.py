"""The tuning table: schema, tolerant read, atomic upsert, own-bucket lookup by plan version; candidate side
agrees."""

import importlib.util
import itertools
import json
import random
import threading
import warnings

import pytest

from conftest import REPO
from kopt.errors import LedgerError
from kopt.store import tuning
from kopt.store.tuning import TuningRow

LOOKUP_PY = REPO / "solution" / "tilelang" / "tuning_lookup.py"


@pytest.fixture
def cand():
    """The candidate-side lookup module, loaded by path like a candidate's sibling (fresh caches)."""
    spec = importlib.util.spec_from_file_location("tuning_lookup_under_test", LOOKUP_PY)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def row(**kw) -> TuningRow:
    base = dict(device="H200", units=132, dtype="fp16", head_dim=128, batch=16, seqlen_bucket=4096, kv_heads=4,
                gqa=8, page_size=0, config={"block_N": 64, "num_splits": 8}, runtime_ms=0.1,
                default_runtime_ms=0.12, gain=1.2, commit="abc")
    return TuningRow(**(base | kw))


Q = dict(device="NVIDIA H200", units=132, dtype="fp16", head_dim=128, batch=16, seqlen_k=4096, kv_heads=4, gqa=8,
         page_size=None)


def test_bucket_is_next_power_of_two():
    assert [tuning.bucket(s) for s in (0, 1, 2, 3, 17, 64, 65, 8192, 12251, 61519)] == \
        [1, 1, 2, 4, 32, 64, 128, 8192, 16384, 65536]


def test_write_read_roundtrip(tmp_path):
    p = tmp_path / "t.csv"
    rows = [row(), row(batch=32, config={"block_N": 128}, commit=None, gain=None)]
    tuning.write(p, rows)
    header = p.read_text().splitlines()[0].split(",")
    assert tuple(header) == tuning.COLUMNS and header[0] == "schema_version"
    got = tuning.read(p)
    assert not got.skipped and [r.key for r in got.rows] == [r.key for r in rows]
    assert got.rows[1].config == {"block_N": 128} and got.rows[1].commit is None and got.rows[1].gain is None
    assert got.rows[0].runtime_ms == 0.1 and got.rows[0].dtype == "fp16"


def test_read_tolerates_extra_and_missing_optional_columns(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("device,units,dtype,head_dim,batch,seqlen_bucket,kv_heads,gqa,page_size,config,note\n"
                 'H200,132,float16,128,16,4096,4,8,0,"{""num_splits"": 4}",hand-tuned\n'
                 'H200,132,fp16,128,oops,4096,4,8,0,"{}",bad batch\n'
                 'H200,132,fp16,128,8,4096,4,8,0,"[1]",bad config\n')
    got = tuning.read(p)
    assert len(got.rows) == 1 and got.rows[0].config == {"num_splits": 4} and got.rows[0].dtype == "fp16"
    assert got.rows[0].schema_version == 1 and got.rows[0].runtime_ms is None
    assert [ln for ln, _ in got.skipped] == [3, 4]


def test_read_missing_file_and_missing_required_columns(tmp_path):
    assert tuning.read(tmp_path / "none.csv").rows == []
    p = tmp_path / "t.csv"
    p.write_text("device,units,config\nH200,132,{}\n")
    got = tuning.read(p)
    assert got.rows == [] and got.skipped[0][0] == 1 and "dtype" in got.skipped[0][1]
    with pytest.raises(LedgerError):
        tuning.upsert(p, [row()])
    assert p.read_text() == "device,units,config\nH200,132,{}\n"  # refused, not clobbered


def test_upsert_replaces_same_key_keeps_others_extras_and_bad_rows(tmp_path):
    p = tmp_path / "results" / "tilelang" / "tuning.csv"
    tuning.upsert(p, [row(), row(batch=32)])
    text = p.read_text().replace("schema_version,", "note,schema_version,", 1)
    lines = text.splitlines()
    lines[1] = "keep-me," + lines[1]
    lines[2] = "," + lines[2]
    p.write_text("\n".join(lines + [",1,H200,132,fp16,128,NaN-batch,4096,4,8,0,{},,,,,"]) + "\n")
    tuning.upsert(p, [row(config={"block_N": 128}, runtime_ms=0.09)])
    got = tuning.read(p)
    assert len(got.rows) == 2 and len(got.skipped) == 1          # the bad row is still there, verbatim
    by_batch = {r.batch: r for r in got.rows}
    assert by_batch[16].config == {"block_N": 128} and by_batch[16].runtime_ms == 0.09
    assert "note" in p.read_text().splitlines()[0] and "NaN-batch" in p.read_text()
    assert not list(p.parent.glob("*.tmp"))


def test_concurrent_upserts_lose_nothing(tmp_path):
    p = tmp_path / "t.csv"
    threads = [threading.Thread(target=tuning.upsert, args=(p, [row(batch=b)])) for b in range(1, 13)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.batch for r in tuning.read(p).rows) == list(range(1, 13))


def test_nearest_own_bucket_only():
    """A row applies to its own seqlen bucket and batch bucket (next powers of two) only, never to a neighbour's; within
    a bucket the nearest batch wins (a tie: the smaller batch)."""
    rows = [row(batch=16, config={"a": 1}), row(batch=32, config={"a": 2}), row(seqlen_bucket=8192, config={"a": 3})]
    assert tuning.nearest(rows, **Q).config == {"a": 1}
    assert tuning.nearest(rows, **(Q | {"batch": 9})).config == {"a": 1}      # batch bucket 16
    assert tuning.nearest(rows, **(Q | {"batch": 17})).config == {"a": 2}     # batch bucket 32
    assert tuning.nearest(rows, **(Q | {"batch": 8})) is None                 # bucket 8: no row (was: 16's)
    assert tuning.nearest(rows, **(Q | {"batch": 64})) is None                # bucket 64: no row (was: 32's)
    tie = [row(batch=16, config={"b": 16}), row(batch=9, config={"b": 9})]
    assert tuning.nearest(tie, **(Q | {"batch": 12})).config == {"b": 9}      # a tie (12/9 = 16/12): the smaller
    assert tuning.nearest(rows, **(Q | {"seqlen_k": 5000})).config == {"a": 3}  # bucket 8192
    assert tuning.nearest(rows, **(Q | {"seqlen_k": 2049})).config == {"a": 1}  # bucket 4096
    assert tuning.nearest(rows, **(Q | {"seqlen_k": 2048})) is None             # bucket 2048 (was: 4096's)
    assert tuning.nearest(rows, **(Q | {"seqlen_k": 16384})) is None            # bucket 16384 (was: 8192's)


def test_nearest_plan_version_must_match():
    """A row measured on another plan version (or on none: an older table) never applies."""
    rows = [row(config={"old": 1}), row(batch=32, plan_version="2", config={"v2": 1})]
    assert tuning.nearest(rows, **Q).config == {"old": 1}
    assert tuning.nearest(rows, **(Q | {"plan_version": "1"})) is None
    assert tuning.nearest(rows, **(Q | {"plan_version": 2, "batch": 32})).config == {"v2": 1}
    assert tuning.nearest(rows, **(Q | {"plan_version": "2"})) is None        # batch 16: bucket 16, the row is 32's


def test_nearest_exact_fields_and_device_names():
    rows = [row(), row(device="cpu", units=2, config={"cpu": 1})]
    for bad in ({"units": 114}, {"dtype": "bf16"}, {"head_dim": 64}, {"kv_heads": 8}, {"gqa": 4},
                {"page_size": 16}, {"device": "NVIDIA H100 80GB HBM3"}, {"device": "H2000"}):
        assert tuning.nearest(rows, **(Q | bad)) is None, bad
    for ok in ("H200", "h200", "NVIDIA H200", "NVIDIA H200 NVL"):
        assert tuning.nearest(rows, **(Q | {"device": ok})) is not None, ok
    assert tuning.nearest(rows, **(Q | {"page_size": 0, "dtype": "torch.float16"})) is not None
    assert tuning.nearest(rows, **(Q | {"device": "cpu", "units": 2})).config == {"cpu": 1}


def test_lookup_file(tmp_path):
    p = tmp_path / "t.csv"
    assert tuning.lookup(p, **Q) is None
    tuning.upsert(p, [row()])
    assert tuning.lookup(p, **Q) == {"block_N": 64, "num_splits": 8}


def test_candidate_side_agrees_with_harness(tmp_path, cand):
    rng = random.Random(7)
    rows = []
    for i in range(160):
        rows.append(row(device=rng.choice(["H200", "H100", "cpu"]), units=rng.choice([132, 114]),
                        dtype=rng.choice(["fp16", "bf16"]), head_dim=rng.choice([64, 128]),
                        batch=rng.choice([1, 3, 4, 6, 8, 12, 16, 32, 64]), seqlen_bucket=2 ** rng.randint(0, 16),
                        kv_heads=rng.choice([4, 8]), gqa=rng.choice([4, 8]), page_size=rng.choice([0, 16, 256]),
                        plan_version=rng.choice([None, "1", "2"]), config={"i": i}))
    p = tmp_path / "t.csv"
    tuning.write(p, rows)
    harness_rows = tuning.read(p).rows
    hits = 0
    for _ in range(600):
        q = dict(device=rng.choice(["NVIDIA H200", "H100", "cpu", "A100"]), units=rng.choice([132, 114]),
                 dtype=rng.choice(["fp16", "bf16"]), head_dim=rng.choice([64, 128]), batch=rng.randint(1, 80),
                 seqlen_k=rng.randint(1, 70000), kv_heads=rng.choice([4, 8]), gqa=rng.choice([4, 8]),
                 page_size=rng.choice([None, 0, 16, 256]), plan_version=rng.choice([None, "1", "2"]))
        if rng.random() < 0.6:                         # near a stored row: the bucket and version rules decide
            r = rng.choice(rows)
            q.update(device=r.device, units=r.units, dtype=r.dtype, head_dim=r.head_dim, kv_heads=r.kv_heads,
                     gqa=r.gqa, page_size=r.page_size, batch=max(1, round(r.batch * rng.uniform(0.5, 1.5))),
                     seqlen_k=max(1, round(r.seqlen_bucket * rng.uniform(0.4, 1.6))),
                     plan_version=r.plan_version if rng.random() < 0.8 else rng.choice([None, "1", "2"]))
        h = tuning.nearest(harness_rows, **q)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")           # rows of another version: warned, skipped
            c = cand.lookup(q["device"], q["units"], q["dtype"], q["head_dim"], q["batch"], q["seqlen_k"],
                            q["kv_heads"], q["gqa"], q["page_size"], path=p, plan_version=q["plan_version"])
        assert (h.config if h else None) == c, q
        hits += c is not None
    assert hits > 40                                  # the sample exercises matches, not only misses
    assert cand.bucket(12251) == tuning.bucket(12251)


def test_candidate_side_malformed_warns_once_and_returns_none(tmp_path, cand):
    p = tmp_path / "t.csv"
    p.write_text("device,units\nH200,132\n")
    args = ("NVIDIA H200", 132, "fp16", 128, 16, 4096, 4, 8, 0)
    with pytest.warns(RuntimeWarning, match="missing columns"):
        assert cand.lookup(*args, path=p) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")               # a second call must not warn again
        assert cand.lookup(*args, path=p) is None
    p.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.warns(RuntimeWarning, match="unreadable"):
        assert cand.lookup(*args, path=p) is None
    with pytest.warns(RuntimeWarning, match="not found"):
        assert cand.lookup(*args, path=tmp_path / "none.csv") is None


def test_candidate_side_path_cache_and_bad_rows(tmp_path, cand, monkeypatch):
    p = tmp_path / "t.csv"
    tuning.write(p, [row()])
    assert cand.table_path() == cand.DEFAULT_TABLE          # the kernel reads no environment (static rule KS208)
    assert cand.lookup("NVIDIA H200", 132, "fp16", 128, 16, 4096, 4, 8, None, path=p) == {"block_N": 64,
                                                                                       "num_splits": 8}
    with open(p, "a") as fh:                          # appended rows: new size, so the cache reloads
        fh.write('1,H200,132,fp16,128,16,4096,4,8,0,not-json,,,,,\n1,H200,132,fp16,128,64,4096,4,8,0,"{""x"":1}",,,,,\n')
    with pytest.warns(RuntimeWarning, match="malformed"):
        assert cand.lookup("NVIDIA H200", 132, "fp16", 128, 64, 4096, 4, 8, 0, path=p) == {"x": 1}


def test_candidate_side_default_path_and_lookup_for(tmp_path, cand, monkeypatch):
    import os

    import torch

    assert cand.DEFAULT_TABLE == REPO / "results" / "tilelang" / "tuning.csv"
    p = tmp_path / "t.csv"
    tuning.write(p, [row(device="cpu", units=os.cpu_count(), batch=2, seqlen_bucket=256, page_size=16,
                         config={"cpu_block_N": 16})])
    q = torch.zeros(2, 1, 32, 128, dtype=torch.float16)
    kc = torch.zeros(40, 16, 4, 128, dtype=torch.float16)
    bt = torch.zeros(2, 13, dtype=torch.int32)            # 13 pages x 16 = 208 -> bucket 256
    assert cand.lookup_for(q, kc, bt, path=p) == {"cpu_block_N": 16}
    assert cand.lookup_for(q, torch.zeros(2, 208, 4, 128, dtype=torch.float16), None, path=p) is None
    with pytest.warns(RuntimeWarning, match="unknown to this kernel"):   # a row for another kernel version
        assert cand.lookup_for(q, kc, bt, path=p, keys=("block_N", "num_splits")) is None
    assert cand.lookup_for(q, kc, bt, path=p, keys=("cpu_block_N",)) == {"cpu_block_N": 16}


def test_row_key_and_cells():
    r = row()
    assert r.key == ("H200", 132, "fp16", 128, 16, 4096, 4, 8, 0)
    cells = r.cells()
    assert json.loads(cells["config"]) == r.config and cells["commit"] == "abc" and set(cells) == set(tuning.COLUMNS)
    assert list(itertools.islice(tuning.COLUMNS, 1, 10)) == list(tuning.KEY)


def test_committed_table_drives_the_shipped_kernel(cand):
    """results/tilelang/tuning.csv is what the shipped kernel reads by default: every one of its rows (each measured
    on the kernel's own plan version: a bump removes the older rows) is found again for its own case shape, on its own
    device, by the harness-side and the candidate-side readers alike; on another device the shape has no row."""
    from kopt.candidate import plan_version
    from kopt.cases import load_cases

    table = REPO / "results" / "tilelang" / "tuning.csv"
    rows = tuning.read(table).rows
    assert cand.table_path() == table or cand.table_path().resolve() == table.resolve()
    version = plan_version(REPO / "solution" / "tilelang" / "run_kernel.py")
    cases = load_cases()
    for r in rows:
        assert r.plan_version == version, r
        (c,) = [c for c in cases if (c.batch, tuning.bucket(c.capacity), c.kv_heads, c.gqa) ==
                (r.batch, r.seqlen_bucket, r.kv_heads, r.gqa) and c.capacity == r.capacity]
        q = dict(units=r.units, dtype=r.dtype, head_dim=r.head_dim, batch=c.batch, seqlen_k=c.seqlen_k,
                 kv_heads=c.kv_heads, gqa=c.gqa, page_size=r.page_size or None, plan_version=version)
        assert tuning.lookup(table, device=f"NVIDIA {r.device}", **q) == r.config, c.id
        assert cand.lookup(f"NVIDIA {r.device}", **q) == r.config, c.id
        assert cand.lookup("NVIDIA A100-SXM4-80GB", **q) is None, c.id


def test_quick_rows_do_not_replace_a_full_row_of_the_same_kernel(tmp_path):
    """The better-measured row of one candidate is kept; another candidate's row is always replaced."""
    p = tmp_path / "t.csv"
    full = row(config={"block_N": 128, "num_splits": 32}, candidate_id="aaa", quick=False)
    tuning.upsert(p, [full])
    tuning.upsert(p, [row(config={"block_N": 0}, candidate_id="aaa", quick=True)])   # quick, same kernel: kept out
    assert [r.config for r in tuning.read(p).rows] == [{"block_N": 128, "num_splits": 32}]
    tuning.upsert(p, [row(config={"block_N": 64}, candidate_id="aaa", quick=False)])  # full replaces full
    assert [r.config for r in tuning.read(p).rows] == [{"block_N": 64}]
    tuning.upsert(p, [row(config={"block_N": 32}, candidate_id="bbb", quick=True)])   # another kernel: replaced
    rows = tuning.read(p).rows
    assert [(r.config, r.candidate_id, r.quick) for r in rows] == [({"block_N": 32}, "bbb", True)]
    tuning.upsert(p, [row(config={"block_N": 16})])                                   # no candidate id: replaced
    assert [r.config for r in tuning.read(p).rows] == [{"block_N": 16}]
