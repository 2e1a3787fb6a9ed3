"""Peers on the CPU: each adapter's argument mapping with its library faked, NA reasons, the child's and
the parent's halves of `kopt peers`, the panel's table and geomeans, and the command end to end."""

import json
import sys
import types

import pytest

from conftest import CANDIDATES, SHIPPED, kopt, peer_rows
from kopt import baselines
from kopt.baselines import hopper as baselines_hopper
from kopt.baselines import torch_attention
from kopt.cases import load_cases
from kopt.eval import checks
from kopt.reference import reference
from kopt.workload import Workload, make_workload


def _case(i, **variant):
    return next(c for c in load_cases() if c.id == i).with_variant(**variant)


def _attend(q, k, v, lens, table, scale):
    """What a correct decode kernel returns for these arguments (torch SDPA over the logical cache)."""
    return torch_attention(Workload(q, k, v, lens, table, scale, 0))


def _ok(out, w):
    return checks.check_output(out, reference(w), torch_attention(w), w.q).status.value == "ok"


@pytest.fixture
def fake_fa2(monkeypatch):
    calls = []

    def flash_attn_with_kvcache(q, k, v, cache_seqlens=None, block_table=None, softmax_scale=None,
                                causal=True, num_splits=1):
        calls.append(dict(k=k, block_table=block_table, causal=causal, num_splits=num_splits))
        return _attend(q, k, v, cache_seqlens, block_table, softmax_scale)

    mod = types.SimpleNamespace(__version__="2.8.3", flash_attn_with_kvcache=flash_attn_with_kvcache)
    monkeypatch.setitem(sys.modules, "flash_attn", mod)
    return calls


@pytest.fixture
def fake_fa3(monkeypatch):
    calls = []

    def flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=None, page_table=None, softmax_scale=None,
                                causal=True, num_splits=1, **kw):
        calls.append(dict(k=k_cache, page_table=page_table, causal=causal, num_splits=num_splits, kw=kw))
        return _attend(q, k_cache, v_cache, cache_seqlens, page_table, softmax_scale)

    flags = {"FLASHATTENTION_DISABLE_FP16": True, "FLASHATTENTION_DISABLE_PAGEDKV": True,
             "FLASHATTENTION_DISABLE_HDIM64": False, "FLASHATTENTION_DISABLE_SM8x": False}
    monkeypatch.setitem(sys.modules, "flash_attn_interface", None)  # the hopper build absent: import fails
    monkeypatch.setitem(sys.modules, "fa3_fwd_interface",
                        types.SimpleNamespace(flash_attn_with_kvcache=flash_attn_with_kvcache))
    monkeypatch.setitem(sys.modules, "flash_attn_config", types.SimpleNamespace(CONFIG={"build_flags": flags}))
    monkeypatch.setattr(baselines_hopper, "_capability", lambda: (9, 0))
    return calls


class _Decode:
    """FlashInfer's decode wrapper, as far as the adapter uses it: plan() records, run() decodes the pages."""

    plans = []

    def __init__(self, workspace, layout, use_tensor_cores=False):
        assert layout == "NHD" and use_tensor_cores
        self.runs = 0

    def plan(self, indptr, indices, last_page_len, hq, hkv, d, page, pos_encoding_mode="ROPE_LLAMA",
             q_data_type=None, kv_data_type=None, sm_scale=None):
        self.args = (indptr, indices, last_page_len, page, sm_scale)
        _Decode.plans.append(dict(hq=hq, hkv=hkv, d=d, page=page, pos=pos_encoding_mode, q=q_data_type))

    def run(self, q, kv):
        import torch

        indptr, indices, last, page, scale = self.args
        k, v = kv
        outs = []
        for i in range(q.shape[0]):
            pages = indices[indptr[i]:indptr[i + 1]].long()
            n = (len(pages) - 1) * page + int(last[i])
            ki, vi = (x[pages].reshape(-1, *x.shape[2:])[:n] for x in (k, v))
            w = Workload(q[i:i + 1, None], ki[None], vi[None], torch.tensor([n], dtype=torch.int32), None, scale, 0)
            outs.append(torch_attention(w)[:, 0])
        self.runs += 1
        return torch.cat(outs)


@pytest.fixture
def fake_flashinfer(monkeypatch):
    _Decode.plans = []
    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace(
        __version__="0.2.8", BatchDecodeWithPagedKVCacheWrapper=_Decode))
    return _Decode.plans


# ---------------------------------------------------------------- adapters

def test_cpu_peers_need_cuda_except_torch():
    c = _case(2)
    for name in ("fa2", "fa2-paged", "fa3", "flashinfer"):
        b = baselines.pick(c, "cpu", name)
        assert b.na == "needs CUDA" and b.name == name
        with pytest.raises(baselines.NotAvailable, match="NA: needs CUDA"):
            b.fn(make_workload(c, 0))
    t = baselines.pick(c, "cpu", "torch")
    assert t.na is None and t.name.startswith("torch-cpu-")
    assert baselines.pick(c, "cpu").name == "torch-cpu"  # auto is unchanged


def test_unknown_peer_is_a_usage_error():
    from kopt.errors import UsageError

    with pytest.raises(UsageError, match="fa2-paged"):
        baselines.pick(_case(2), "cuda", "fa4")


def test_missing_libraries_are_na_not_a_substitute(monkeypatch):
    for mod in ("flash_attn", "flash_attn_interface", "fa3_fwd_interface", "flashinfer"):
        monkeypatch.setitem(sys.modules, mod, None)
    monkeypatch.delenv("KOPT_FLASHINFER_LIB", raising=False)  # nor FlashInfer's C build (the workspace has none)
    monkeypatch.setattr("kopt.baselines.flashinfer_capi._LOADED", {})
    c = _case(7)
    assert baselines.pick(c, "cuda", "fa2").na == "flash-attn not importable"
    assert baselines.pick(c, "cuda", "fa2-paged").na == "flash-attn not importable"
    assert "FlashAttention-3 not importable" in baselines.pick(c, "cuda", "fa3").na
    assert "flashinfer not importable" in baselines.pick(c, "cuda", "flashinfer").na
    assert baselines.pick(c, "cuda").name == "torch-sdpa"  # auto says what it fell back to, as before


def test_fa2_contiguous_and_paged256(fake_fa2):
    c = _case(5, seqlens="ragged")  # 141 keys: one page of 256, padded
    w = make_workload(c, 3)
    fa2 = baselines.pick(c, "cuda", "fa2")
    assert fa2.name == "flash_attn-2.8.3" and _ok(fa2.fn(w), w)
    assert fake_fa2[-1]["block_table"] is None and fake_fa2[-1]["num_splits"] == 0 and not fake_fa2[-1]["causal"]
    paged = baselines.pick(c, "cuda", "fa2-paged")
    assert paged.name == "flash_attn-2.8.3-paged256"
    n = len(fake_fa2)
    call = paged.bind(w)  # the paging happens here, outside the timed call
    assert len(fake_fa2) == n and _ok(call(), w)
    got = fake_fa2[-1]
    assert got["k"].shape == (c.batch, 256, c.kv_heads, 128) and got["block_table"].shape == (c.batch, 1)
    assert sorted(got["block_table"].flatten().tolist()) == list(range(c.batch))


def test_fa2_paged_runs_a_256_paged_case_on_its_own_pages(fake_fa2):
    c = _case(7, page_size=256)
    w = make_workload(_case(3, page_size=256), 1)  # a small shape for the call
    b = baselines.pick(c, "cuda", "fa2-paged")
    b.fn(w)
    assert fake_fa2[-1]["k"] is w.k_cache and fake_fa2[-1]["block_table"] is w.block_table
    assert "page_size % 256" in baselines.pick(_case(7, page_size=16), "cuda", "fa2").na
    assert baselines.pick(_case(7, page_size=16), "cuda", "fa2-paged").na is None  # re-paged by 256
    assert "head_dim" not in (baselines.pick(_case(3, head_dim=64), "cuda", "fa2-paged").na or "")


def test_fa3_mapping_and_build_flags(fake_fa3, monkeypatch):
    c = _case(3, dtype="bf16", seqlens="ragged")
    w = make_workload(c, 2)
    b = baselines.pick(c, "cuda", "fa3")
    assert b.na is None and b.name == "fa3_fwd-unknown"  # the archive carries no package metadata
    assert _ok(b.fn(w), w)
    call = fake_fa3[-1]
    assert call["k"] is w.k_cache and call["page_table"] is None and call["num_splits"] == 0 and not call["causal"]
    assert baselines.pick(_case(3), "cuda", "fa3").na == "fp16 compiled out of this FA3 build (bf16 only)"
    assert baselines.pick(_case(3, dtype="bf16", page_size=64), "cuda",
                          "fa3").na == "paged KV compiled out of this FA3 build"
    monkeypatch.setattr(baselines_hopper, "dist_version", lambda *n: "0.0.3" if "fa3-fwd" in n else None)
    assert baselines.pick(c, "cuda", "fa3").name == "fa3_fwd-0.0.3"
    monkeypatch.setattr(baselines_hopper, "_capability", lambda: (7, 5))
    assert "sm_90" in baselines.pick(c, "cuda", "fa3").na


def test_fa3_paged_when_the_build_has_it(fake_fa3, monkeypatch):
    sys.modules["flash_attn_config"].CONFIG["build_flags"]["FLASHATTENTION_DISABLE_PAGEDKV"] = False
    c = _case(5, dtype="bf16", page_size=16, seqlens="ragged")
    w = make_workload(c, 4)
    assert _ok(baselines.pick(c, "cuda", "fa3").fn(w), w)
    assert fake_fa3[-1]["page_table"] is w.block_table  # FA3 calls the block table page_table


@pytest.mark.parametrize("page", [None, 16])
def test_flashinfer_pages_plan_outside_the_call(fake_flashinfer, page):
    c = _case(5, page_size=page, seqlens="ragged", dtype="bf16")
    w = make_workload(c, 6)
    b = baselines.pick(c, "cuda", "flashinfer")
    assert b.na is None and b.name.startswith("flashinfer-")
    call = b.bind(w)
    assert len(fake_flashinfer) == 1  # planned in the preparation
    out = call()
    assert len(fake_flashinfer) == 1 and out.shape == w.q.shape and _ok(out, w)
    p = fake_flashinfer[0]
    assert (p["hq"], p["hkv"], p["d"], p["pos"]) == (c.q_heads, c.kv_heads, 128, "NONE")
    assert p["page"] == (page or baselines_hopper.contiguous_page(c.seqlen_k))  # contiguous: viewed as pages
    fp = baselines_hopper.flashinfer_pages(w)
    assert int(fp.indptr[-1]) == len(fp.indices) and bool((fp.last_page_len >= 1).all())
    assert bool((fp.last_page_len <= fp.page_size).all()) and fp.k.data_ptr() == w.k_cache.data_ptr()  # no copy


def test_timed_calls_rotate_prepared_inputs():
    seen = []
    b = baselines.prepared("x", lambda w: (lambda: seen.append(w)))
    f = b.timed(["a", "b"])
    for _ in range(3):
        f()
    assert seen == ["b", "a", "b"]  # as kopt.timing.rotating: inputs[1] first


# ---------------------------------------------------------------- the child and the parent

def _job(tmp_path, case, peers):
    from kopt.eval.jobs import Job

    return Job(candidate_path="x", case=case, device="cpu", seeds_correct=[7], seeds_timing=[7, 8],
               out_dir=str(tmp_path), peers=peers)


def test_time_peers_na_failed_and_timed(tmp_path, monkeypatch):
    from kopt.eval import peers
    from kopt.eval.jobs import WorkerResult
    from kopt.timing import TimingOptions, rotating

    c = _case(2)
    timed = [make_workload(c, 7), make_workload(c, 8)]
    real = baselines.pick

    def pick(case, device, name):
        if name == "fa3":
            return baselines.Baseline("fa3-x", lambda w: 1 / 0)
        return real(case, device, name)

    monkeypatch.setattr(baselines, "pick", pick)
    res = WorkerResult()
    peers.time_peers(res, rotating(torch_attention, timed), timed, _job(tmp_path, c, ["fa2", "fa3", "torch"]),
                     TimingOptions.for_device("cpu", quick=True))
    na = {p.peer: p.na for p in res.peers}
    assert na["fa2"] == "needs CUDA" and na["fa3"].startswith("failed: ZeroDivisionError") and na["torch"] is None
    t = res.peers[2]
    assert t.timing and t.ref_timing and t.speedup and t.speedup_ci and res.ref_name == t.ref
    assert (tmp_path / "peer-torch.pt").is_file() and not (tmp_path / "peer-fa3.pt").exists()


def test_settle_reports_a_wrong_peer_and_never_picks_it(tmp_path):
    import torch

    from kopt.eval import peers
    from kopt.records import CaseResult, PeerResult, Status, TimingStats

    c = _case(2)
    w = make_workload(c, 5)
    torch.save(torch_attention(w), tmp_path / "peer-fa2.pt")
    torch.save(torch.zeros_like(w.q), tmp_path / "peer-fa3.pt")

    def t(ms):
        return TimingStats(method="host", median_ms=ms, q1_ms=ms, q3_ms=ms, min_ms=ms, n=3, rel_iqr=0.0)

    ps = [PeerResult(peer="fa2", ref="flash_attn-2.8.3", timing=t(1.0), ref_timing=t(2.0), speedup=2.0,
                     speedup_ci=(1.9, 2.1)),
          PeerResult(peer="fa3", ref="fa3_fwd-0.0.3", timing=t(1.0), ref_timing=t(0.5), speedup=0.5,
                     speedup_ci=(0.4, 0.6)),
          PeerResult(peer="flashinfer", ref="flashinfer", na="needs CUDA")]
    r = CaseResult(row_id="r", case=2, seed=5, peers=ps, status=Status.ok)
    peers.settle(r, c, "cpu", tmp_path)
    assert ps[0].correct and ps[1].correct is False and "incorrect_numerical" in ps[1].message
    assert r.ref == "flash_attn-2.8.3" and r.speedup == 2.0 and r.ref_runtime_ms == 2.0 and r.status == Status.ok
    r2 = CaseResult(row_id="r", case=2, seed=5, peers=[ps[1], ps[2]], status=Status.ok)
    peers.settle(r2, c, "cpu", tmp_path)
    assert r2.status == Status.baseline_error and r2.speedup is None and "no peer ran correctly" in r2.message


# ---------------------------------------------------------------- the panel

def test_panel_best_peer_geomeans_and_na_reasons():
    from kopt.report import panel as peers_panel
    from kopt.timing.stats import geomean

    p = peers_panel.build(peer_rows(), {1: "edge", 7: "perf", 15: "ragged"})
    assert p.peers == ["fa2", "fa2-paged", "fa3", "torch"]
    assert [r.best.peer for r in p.rows] == ["fa2", "fa2-paged", "fa2"]  # a wrong fa3 is never the best
    gm, n = p.geomean_best()
    assert n == 3 and gm == pytest.approx(geomean([2.0, 1.27, 2.0]))
    assert p.geomean_peer("fa3") == (pytest.approx(3.0), 1)
    head, body = peers_panel.table(p)
    assert head[4:8] == ["fa2 ms (x)", "fa2-paged ms (x)", "fa3 ms (x)", "torch ms (x)"]
    assert body[1][4:8] == ["0.1890 "
                            "(1.89x)", "0.1270 "
                                       "(1.27x)", "NA", "NA"] and body[1][-3:] == ["fa2-paged", "1.27x", "1.26-1.28"]
    text = "\n".join(peers_panel.notes(p))
    assert "NA fa3 on case(s) 7: wrong: max abs err 1" in text and "NA fa3 on case(s) 15: fp16 compiled out" in text
    assert "ragged: 2.00x (1 cases)" in text and "over fa2 (fa2-1.0): " in text
    md = peers_panel.markdown(p)
    assert md.count("\n| ") == 4 and "candidate abc on H200" in md


def test_panel_csv_and_report_section():
    import csv
    import io

    from kopt.report import panel as peers_panel

    p = peers_panel.build(peer_rows())
    rows = list(csv.DictReader(io.StringIO(peers_panel.csv_text(p))))
    assert len(rows) == 3 * len(p.peers) and set(rows[0]) == set(peers_panel.CSV_COLUMNS)
    best = [r for r in rows if r["best"] == "1"]
    assert [(r["case"], r["peer"]) for r in best] == [("1", "fa2"), ("7", "fa2-paged"), ("15", "fa2")]
    fa3 = {r["case"]: r for r in rows if r["peer"] == "fa3"}
    assert fa3["7"]["state"] == "wrong" and fa3["15"]["state"] == "NA" and fa3["15"]["speedup"] == "NA"
    assert peers_panel.html_section([{"mode": "signal"}]) == ""
    html = peers_panel.html_section(peer_rows() + [{**peer_rows()[0], "run_id": "old", "mode": "verdict"}])
    assert html.startswith("<h2>Peers</h2>") and "fa2-paged" in html


# ---------------------------------------------------------------- the command

def test_peers_cli_cpu_end_to_end(workspace):
    """The shipped kernel against the one peer a CPU has (torch); the others NA with their reason."""
    r = kopt("peers", "--device", "cpu", "--case", "2", "--quick", "--candidate", SHIPPED)
    assert r.exit_code == 0, r.output
    assert "| 2 | edge |" in r.stdout and "NA fa3 on case(s) 2: needs CUDA" in r.stdout
    from kopt.records import CaseResult
    from kopt.store.ledger import load

    row = load(CaseResult, workspace / "candidates.jsonl").rows[-1]
    assert row.mode == "peers" and row.correct and row.ref.startswith("torch-cpu-") and row.speedup
    assert [p.peer for p in row.peers] == list(baselines.PEERS)
    assert row.peers[-1].correct and all(p.na == "needs CUDA" for p in row.peers[:-1])
    csvs = list((workspace / "results" / "tilelang").glob("peers-cpu-*.csv"))
    assert len(csvs) == 1 and csvs[0].with_suffix(".md").is_file()
    from kopt.report import panel as peers_panel

    html = peers_panel.report_section(workspace, "cpu")
    assert "<h2>Peers</h2>" in html and "needs CUDA" in html


def test_peers_cli_usage_and_json(workspace):
    r = kopt("peers", "--case", "2", "--peers", "fa4")
    assert r.exit_code == 2 and "unknown peer" in str(r.exception) + r.output
    r = kopt("peers", "--device", "cpu", "--case", "2", "--quick", "--no-record", "--json", "--peers", "fa3,torch",
             "--candidate", CANDIDATES / "torch_honest.py")
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    assert [p["peer"] for p in obj["rows"][0]["peers"]] == ["fa3", "torch"] and not obj["files"]
    assert not (workspace / "candidates.jsonl").exists()


def test_an_earlier_candidate_file_is_timed_as_a_peer(workspace, tmp_path):
    """--peers torch,OLD.py: the earlier candidate runs its own plan in the same child, paired with the timed one
    (ABBA), its output checked like any peer's; it is named cand-<id> in the row. A file that does not import is NA
    with the reason; a file that is not there is a usage error before any work."""
    from conftest import TUNE_CANDIDATE
    from kopt.candidate import candidate_id
    from kopt.records import CaseResult
    from kopt.store.ledger import load

    old = tmp_path / "old" / "run_kernel.py"
    old.parent.mkdir()
    old.write_text(TUNE_CANDIDATE % "False")
    broken = tmp_path / "broken" / "run_kernel.py"
    broken.parent.mkdir()
    broken.write_text("def run(:\n")
    r = kopt("peers", "--device", "cpu", "--case", "2", "--quick", "--peers", f"torch,{old},{broken}",
             "--candidate", CANDIDATES / "torch_honest.py")
    assert r.exit_code == 0, r.output
    row = load(CaseResult, workspace / "candidates.jsonl").rows[-1]
    name = f"cand-{candidate_id(old)}"
    assert [p.peer for p in row.peers] == ["torch", name, f"cand-{candidate_id(broken)}"]
    torch_p, mine, bad = row.peers
    assert mine.correct and mine.na is None and mine.speedup and mine.speedup_ci and mine.timing.median_ms > 0
    assert mine.ref == name and torch_p.correct and row.ref == torch_p.ref   # the named peer stands for the best
    assert bad.na and "does not import" in bad.na and bad.correct is None
    assert name in r.stdout                                                   # the panel shows it
    # an A/B run writes its own files, never the device's peers panel or plot
    backend = workspace / "results" / row.backend
    assert list(backend.glob("ab-cpu-*.csv")) and list(backend.glob("ab-cpu-*.md"))
    assert not list(backend.glob("peers-cpu-*")) and not (backend / "plots").exists()
    from kopt.report import panel

    assert panel.report_section(workspace, "cpu") == ""

    r = kopt("peers", "--case", "2", "--peers", f"torch,{tmp_path / 'gone.py'}")
    assert r.exit_code == 2 and "peer candidate file" in str(r.exception) + r.output


def test_a_commits_candidate_is_timed_as_a_peer(workspace, tmp_path, monkeypatch):
    """--peers REV:PATH.py: the candidate as a commit of the workspace's repository holds it (its folder exported into
    kopt's cache), timed like a candidate file, and so is a .patch over the shipped candidate; a revision that is not
    a commit, a commit without the file, or a missing patch is a usage error (exit 2) before any work."""
    import subprocess

    from conftest import TUNE_CANDIDATE
    from kopt.candidate import candidate_id

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    old = workspace / "old" / "run_kernel.py"
    old.parent.mkdir()
    old.write_text(TUNE_CANDIDATE % "False")

    def git(*a):
        subprocess.run(["git", "-C", str(workspace), "-c", "user.email=t@t", "-c", "user.name=t", *a], check=True,
                       capture_output=True)

    git("init", "-q")
    git("add", "old/run_kernel.py")
    git("commit", "-qm", "old")
    committed = candidate_id(old)
    old.write_text("def run(:\n")  # the working copy no longer imports: the commit's file must be the one timed
    r = kopt("peers", "--device", "cpu", "--case", "2", "--quick", "--no-record", "--json",
             "--peers", "torch,HEAD:old/run_kernel.py", "--candidate", CANDIDATES / "torch_honest.py")
    assert r.exit_code == 0, r.output
    peers = json.loads(r.stdout)["rows"][0]["peers"]
    assert [p["peer"] for p in peers] == ["torch", f"cand-{committed}"]
    assert peers[1]["correct"] and peers[1]["na"] is None
    for spec, msg in (("nope:old/run_kernel.py", "is not a commit"), ("HEAD:new/run_kernel.py", "has no file")):
        r = kopt("peers", "--device", "cpu", "--case", "2", "--peers", f"torch,{spec}")
        assert r.exit_code == 2 and msg in str(r.exception) + r.output
    # a patch over the shipped candidate (solution/tilelang/run_kernel.py) is timed the same way: the patched copy's
    # id, the shipped file untouched
    shipped = workspace / "solution" / "tilelang" / "run_kernel.py"
    shipped.parent.mkdir(parents=True)
    shipped.write_text(TUNE_CANDIDATE % "False")
    git("add", "solution")
    git("commit", "-qm", "shipped")
    shipped.write_text(TUNE_CANDIDATE.replace('{"passes": 6}', '{"passes": 2}') % "False")
    patched = candidate_id(shipped)
    diff = subprocess.run(["git", "-C", str(workspace), "diff", "--", "solution"], check=True, capture_output=True,
                          text=True).stdout
    (tmp_path / "two-passes.patch").write_text(diff)
    git("checkout", "--", "solution")
    r = kopt("peers", "--device", "cpu", "--case", "2", "--quick", "--no-record", "--json",
             "--peers", f"torch,{tmp_path / 'two-passes.patch'}", "--candidate", CANDIDATES / "torch_honest.py")
    assert r.exit_code == 0, r.output
    peers = json.loads(r.stdout)["rows"][0]["peers"]
    assert [p["peer"] for p in peers] == ["torch", f"cand-{patched}"] and peers[1]["correct"]
    assert shipped.read_text() == TUNE_CANDIDATE % "False" and patched != candidate_id(shipped)
    r = kopt("peers", "--device", "cpu", "--case", "2", "--peers", f"torch,{tmp_path / 'gone.patch'}")
    assert r.exit_code == 2 and "gone.patch not found" in str(r.exception) + r.output
    assert not (workspace / "candidates.jsonl").exists()


def test_the_panel_is_the_newest_run_of_peer_kernels_not_an_ab_run():
    from kopt.report import panel

    rows = peer_rows()
    ab = [{**r, "run_id": "ab-run", "peers": [{"peer": "cand-0123456789ab", "ref": "cand-0123456789ab"}]}
          for r in rows]
    assert panel.latest_rows(rows + ab) == rows and panel.is_ab(ab) and not panel.is_ab(rows)
    assert panel.latest_rows(ab) == []


def test_an_earlier_candidate_never_stands_for_the_best_peer_while_a_named_one_ran():
    from kopt.report.panel import Cell, PanelRow

    cells = {"fa2": Cell("fa2", "flash_attn-2.8.3", ms=0.02, speedup=1.5),
             "cand-abc": Cell("cand-abc", "cand-abc", ms=0.01, speedup=0.8)}
    assert PanelRow(4, "perf", "v", "ok", 0.012, cells).best.peer == "fa2"
    assert PanelRow(4, "perf", "v", "ok", 0.012, {"cand-abc": cells["cand-abc"]}).best.peer == "cand-abc"
    assert baselines.named_first(["cand-x", "fa3"], name=str) == ["fa3"]
    assert baselines.named_first(["cand-x"], name=str) == ["cand-x"]


def test_bench_baseline_peer_na_is_baseline_error(workspace):
    from kopt.records import parse_line

    r = kopt("bench", "--case", "2", "--device", "cpu", "--machine", "--quick", "--no-record", "--baseline", "fa3",
             "--candidate", CANDIDATES / "torch_honest.py")
    f = parse_line(r.stdout.strip())
    assert r.exit_code == 0 and f["STATUS"] == "baseline_error" and f["CORRECT"] == "True" and f["SPEEDUP"] == "NA"
    honest = str(CANDIDATES / "torch_honest.py")
    for args in (["bench", "--candidate", honest], ["verify", honest]):
        r = kopt(*args, "--case", "2", "--baseline", "fa9")
        assert r.exit_code == 2 and "--baseline must be one of" in str(r.exception) + r.output, args


def test_auto_times_fa2_in_its_own_pages_where_the_case_pages_by_less(fake_fa2):
    c = _case(5, seqlens="ragged").with_variant(page_size=16)
    base = baselines.pick(c, "cuda")
    assert base.name == "flash_attn-2.8.3-paged256" and base.prepare is not None  # re-laid outside the timed call
    w = make_workload(c, 3)
    assert _ok(base.fn(w), w)
    assert baselines.pick(c.with_variant(page_size=256), "cuda").name == "flash_attn-2.8.3"


def test_peers_case_past_1000_is_that_draw_of_the_heldout_seed(workspace):
    """--case 1003 --heldout-seed S: the third shape of seed S's draw (as bench and tune read it), its row keeping the
    seed; without the seed it is a usage error."""
    from kopt import workloads
    from kopt.records import CaseResult
    from kopt.store.ledger import load

    r = kopt("peers", "--device", "cpu", "--case", "1003", "--heldout-seed", "20261205", "--quick", "--peers",
             "torch", "--candidate", CANDIDATES / "torch_honest.py")
    assert r.exit_code == 0, r.output
    row = load(CaseResult, workspace / "candidates.jsonl").rows[-1]
    want = workloads.pick(load_cases(), [1003], 12, 20261205, True)[0]
    assert row.case == 1003 and row.case_kind == "heldout" and row.heldout_seed == 20261205
    assert row.model == want.model and row.shape == want.shape_label()
    r = kopt("peers", "--device", "cpu", "--case", "1003", "--quick", "--peers", "torch")
    assert r.exit_code == 2


def test_an_ab_run_on_cuda_compiles_both_candidates_kernels_ahead(monkeypatch, tmp_path):
    """On CUDA, `kopt peers` warms the distinct kernels of the candidate and of each peer candidate file (named peers
    have none) before the paired child starts, each with its own share of the compile jobs."""
    from kopt.eval import bench, prewarm

    seen = []
    monkeypatch.setattr(bench, "resolve_device", lambda d: "cuda")
    monkeypatch.setattr(prewarm, "warm_cases", lambda p, cases, say, jobs=None, config=None: seen.append(
        (p.name, p.parent.name, [c.id for c in cases], jobs, config)))
    monkeypatch.setattr(prewarm, "default_jobs", lambda: 14)
    monkeypatch.setattr(bench, "evaluate", lambda path, cases, opts, on_result: [])
    old = tmp_path / "old" / "run_kernel.py"
    old.parent.mkdir()
    old.write_text("def run(*a, **k):\n    pass\n")
    cases = [c for c in load_cases() if c.id in (2, 5)]
    bench.evaluate_peers(SHIPPED, cases, bench.BenchOptions(config={"block_N": 64}), ["fa2", str(old)])
    assert sorted(seen) == sorted([("run_kernel.py", "tilelang", [2, 5], 7, {"block_N": 64}),
                                   ("run_kernel.py", "old", [2, 5], 7, None)])
