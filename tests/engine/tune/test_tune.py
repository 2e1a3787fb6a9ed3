"""`kopt tune` on the CPU with tiny torch candidates that declare configs(); selection, finalist and winner rules.

The rules are checked on fixed numbers (pick_winner, pick_finalists, finish_case); a real run on a shared CPU is checked
for what it tried and recorded (configs, statuses, rows, fields, and a report that agrees with its own records), never
for which config its timings made the winner."""

import json

import pytest
from typer.testing import CliRunner

from conftest import TUNE_CANDIDATE as CANDIDATE
from conftest import assert_reported_as_recorded
from kopt.cli.main import app
from kopt.records import CaseResult, Status, TimingStats, config_token
from kopt.store import tuning
from kopt.store.ledger import load
from kopt.tune import TuneOptions, finish_case
from kopt.tune.models import ConfigResult, ShardResult
from kopt.tune.pick import pick_finalists, pick_winner, select_indices, shard_indices

# The candidate (conftest.TUNE_CANDIDATE): honest torch attention with a `passes` knob, the default recomputing the
# output 6 times (same result, 6x the work). Which config wins is still the timings' call on a busy machine: the
# tests below never assert it.


def test_select_and_shard_indices():
    assert select_indices(0, 3) == [] and select_indices(5, None) == [0, 1, 2, 3, 4]
    assert select_indices(5, 9) == [0, 1, 2, 3, 4] and select_indices(21, 1) == [0]
    assert select_indices(21, 2) == [0, 1]
    assert select_indices(21, 5) == [0, 1, 7, 14, 20]          # the default + 4 spread over the rest
    sel = select_indices(10, None)
    parts = [shard_indices(sel, s, 3) for s in range(3)]
    assert all(p[0] == 0 for p in parts)                       # every shard re-times the default
    assert sorted(i for p in parts for i in p[1:]) == list(range(1, 10))


def _t(ms, ci=0.005):
    return TimingStats(method="cupti", median_ms=ms, q1_ms=ms, q3_ms=ms, min_ms=ms, n=100, rel_iqr=0.0, ci_rel=ci)


def _cr(index, ms, shard=0, correct=True, ci=0.005, paired=None, status=Status.ok):
    """A checked config; paired=(speedup, lo, hi) makes it a finalist timed against its shard's default."""
    cr = ConfigResult(index=index, shard=shard, config={"i": index}, status=status, correct=correct, cold=_t(ms, ci))
    if paired:
        s, lo, hi = paired
        cr.paired_speedup, cr.paired_ci, cr.paired_a, cr.paired_b = s, (lo, hi), _t(ms / 1.01), _t(ms / 1.01 * s)
    return cr


def test_pick_winner_rules():
    w, d, g, _ = pick_winner([_cr(0, 1.0), _cr(1, 0.8), _cr(2, 0.7, correct=False)])
    assert w.index == 1 and d.index == 0 and g == pytest.approx(1.25)
    w, d, g, note = pick_winner([_cr(0, 1.0), _cr(1, 0.998)])  # inside the CI: keep the default
    assert w.index == 0 and g == 1.0 and "noise" in note
    w, d, g, note = pick_winner([_cr(0, 1.0, ci=3.0), _cr(1, 0.9, ci=2.0)])  # a wide host CI is capped
    assert w.index == 1 and g == pytest.approx(1 / 0.9)
    w, d, g, note = pick_winner([_cr(0, 1.0, correct=False), _cr(1, 0.9)])
    assert w.index == 1 and d is None and g is None and "default" in note
    # shards on different GPUs: compared through each shard's own default
    w, d, g, _ = pick_winner([_cr(0, 1.0, 0), _cr(1, 0.9, 0), _cr(0, 1.2, 1), _cr(2, 0.96, 1)])
    assert (w.index, w.shard, d.shard) == (2, 1, 1) and g == pytest.approx(1.25)
    assert pick_winner([_cr(0, 1.0, correct=False)])[0] is None


def test_pick_winner_paired_rules():
    # a finalist whose CI excludes 1 and whose effect clears max(1%, 3 x A/A): wins with its paired gain
    w, d, g, note = pick_winner([_cr(0, 1.0), _cr(1, 0.9, paired=(1.08, 1.05, 1.10)),
                                 _cr(2, 0.95, paired=(1.03, 1.02, 1.04))], aa_spread=0.005)
    assert (w.index, d.index, note) == (1, 0, "") and g == pytest.approx(1.08)
    # the screen ranked 2 first, but the pairs decide: the highest paired speedup that passes wins
    w, _, g, _ = pick_winner([_cr(0, 1.0), _cr(1, 0.95, paired=(1.04, 1.03, 1.05)),
                              _cr(2, 0.90, paired=(1.02, 1.015, 1.03))], aa_spread=0.001)
    assert w.index == 1 and g == pytest.approx(1.04)
    # within noise: a CI that includes 1, or an effect below 3 x the A/A spread: the default stays
    w, d, g, note = pick_winner([_cr(0, 1.0), _cr(1, 0.9, paired=(1.006, 0.998, 1.012))], aa_spread=0.002)
    assert w.index == 0 and d.index == 0 and g == 1.0
    assert note == "best finalist 1.006x (CI 0.998-1.012): not an improvement, default kept"
    w, _, g, note = pick_winner([_cr(0, 1.0), _cr(1, 0.9, paired=(1.02, 1.01, 1.03))], aa_spread=0.01)
    assert w.index == 0 and g == 1.0 and "1.020x" in note          # needs >= 3% on this device
    # an incorrect finalist never wins, however fast its pairs say it is
    w, _, g, _ = pick_winner([_cr(0, 1.0), _cr(1, 0.5, correct=False, paired=(2.0, 1.9, 2.1)),
                              _cr(2, 0.9, paired=(1.1, 1.08, 1.12))], aa_spread=0.005)
    assert w.index == 2 and g == pytest.approx(1.1)
    w, _, g, note = pick_winner([_cr(0, 1.0), _cr(1, 0.5, correct=False, paired=(2.0, 1.9, 2.1))])
    assert w.index == 0 and g == 1.0 and "finalist" not in note       # unpaired rule: only the default is correct
    # pairs against a default that failed its check mean nothing: the unpaired rule reports it
    w, d, g, note = pick_winner([_cr(0, 1.0, correct=False), _cr(1, 0.9, paired=(1.1, 1.05, 1.15))])
    assert w.index == 1 and d is None and g is None and "default" in note
    # shards: each shard's finalists were paired with that shard's own default
    w, d, g, _ = pick_winner([_cr(0, 1.0, 0), _cr(1, 0.9, 0, paired=(1.1, 1.05, 1.15)),
                              _cr(0, 1.3, 1), _cr(2, 1.1, 1, paired=(1.2, 1.15, 1.25))], aa_spread=0.005)
    assert (w.index, w.shard, d.shard) == (2, 1, 1) and g == pytest.approx(1.2)


def test_pick_finalists_ranks_screened_configs():
    rs = [_cr(0, 1.0), _cr(1, 0.7), _cr(2, 0.9), _cr(3, 0.5, status=Status.crash), _cr(4, 0.8), _cr(5, 0.6)]
    rs[5].cold = None                                                  # screened ok but no cold figure
    assert pick_finalists(rs, 3) == [1, 4, 2]                          # fastest first, ok only, no default
    assert pick_finalists(rs, 1) == [1] and pick_finalists(rs, 10) == [1, 4, 2] and pick_finalists(rs, 0) == []
    assert pick_finalists([_cr(0, 0.1), _cr(1, 0.7), _cr(2, 0.7)], 5) == [1, 2]   # ties: lower index first
    assert pick_finalists([_cr(0, 1.0)], 3) == []                      # the default alone: nothing to pair
    assert pick_finalists([_cr(0, 1.0, status=Status.runtime_error), _cr(1, 0.7)], 3) == []  # nothing to pair with


def test_finish_case_reports_paired_gain(tmp_path):
    cand = tmp_path / "c.py"
    cand.write_text("def run(): pass\n")
    opts = TuneOptions(write=False, record=False)
    shard = ShardResult(device_name="cpu", n_configs=3, finalists=[1],
                        results=[_cr(0, 1.0), _cr(1, 0.9, paired=(1.06, 1.04, 1.08)), _cr(2, 0.95)])
    from kopt.cases import load_cases

    case = load_cases()[1]
    ct = finish_case(cand, case, [shard], opts, parallel=False)
    f = dict(x.split(":", 1) for x in ct.line().split()[1:])
    assert ct.winner.index == 1 and ct.gain_ci == (1.04, 1.08) and ct.row.gain == pytest.approx(1.06)
    assert (ct.row.gain_lo, ct.row.gain_hi) == (1.04, 1.08)
    assert f["GAIN"] == "1.0600x" and f["GAIN_CI"] == "1.0400-1.0800"
    assert (f["FINALIST"], f["FINALIST_GAIN"], f["FINALIST_CI"]) == ("i=1", "1.0600x", "1.0400-1.0800")  # the winner
    # the row's times come from the paired rounds, so runtime and gain agree
    assert ct.row.runtime_ms == pytest.approx(0.9 / 1.01)
    assert ct.row.default_runtime_ms == pytest.approx(0.9 / 1.01 * 1.06)
    shard.results[1] = _cr(1, 0.9, paired=(1.004, 0.99, 1.02))
    shard.pair_error = "RuntimeError: config 2 no longer compiles"
    ct = finish_case(cand, case, [shard], opts, parallel=False)
    f = dict(x.split(":", 1) for x in ct.line().split()[1:])
    assert ct.winner.index == 0 and ct.gain == 1.0 and ct.gain_ci is None and f["GAIN_CI"] == "NA"
    # the default kept its place, and the line still says against what: the finalist's own paired figures
    assert (f["CONFIG"], f["FINALIST"], f["FINALIST_GAIN"], f["FINALIST_CI"]) == \
        ("i=0", "i=1", "1.0040x", "0.9900-1.0200")
    assert "not an improvement, default kept" in ct.note and "pairing stopped: RuntimeError" in ct.note
    assert ct.row.gain_lo is None and ct.row.runtime_ms == ct.row.default_runtime_ms == 1.0


def test_older_table_without_gain_ci_columns_stays_readable(tmp_path):
    """A table written before gain_lo / gain_hi: read as before, and an upsert adds the columns, rows kept."""
    p = tmp_path / "t.csv"
    old_cols = [c for c in tuning.COLUMNS if c not in ("gain_lo", "gain_hi")]
    old = tuning.TuningRow(device="H200", units=132, dtype="fp16", head_dim=128, batch=16, seqlen_bucket=4096,
                           kv_heads=4, gqa=8, config={"num_splits": 4}, gain=1.1)
    p.write_text(",".join(old_cols) + "\n" + ",".join(
        '"{}"'.format(old.cells()[c].replace('"', '""')) for c in old_cols) + "\n")
    assert tuning.read(p).rows[0].config == {"num_splits": 4} and tuning.read(p).rows[0].gain_lo is None
    new = old.model_copy(update={"batch": 32, "gain": 1.05, "gain_lo": 1.02, "gain_hi": 1.08})
    tuning.upsert(p, [new])
    got = tuning.read(p)
    assert not got.skipped
    assert [(r.batch, r.gain_lo, r.gain_hi) for r in got.rows] == [(16, None, None), (32, 1.02, 1.08)]




def test_tune_cli_end_to_end_cpu(workspace, tmp_path):
    """One case, three configs (slow default, fast, crashing): the crash is blamed and skipped, the fast one is paired
    with the default, and whichever the pairs pick is what the line, the table and the ledger record."""
    cand = tmp_path / "passes.py"
    cand.write_text(CANDIDATE % "True")
    r = CliRunner().invoke(app, ["tune", "--case", "2", "--device", "cpu", "--candidate", str(cand), "--quick",
                                 "--gpus", "2", "--json"])
    assert r.exit_code == 0, r.output
    assert "--gpus 2: a CPU run; running serially" in r.stderr
    assert "kopt tune: case 2: 3 configs in" in r.stderr                    # the per-case tune time
    obj = json.loads(r.stdout)
    assert obj["summary"].startswith("TUNE_SUMMARY:ok CASES:1 TUNED:1 NOT_APPLICABLE:0 GEOMEAN_GAIN:")
    (c,) = obj["cases"]
    f = dict(x.split(":", 1) for x in c["line"].split())
    assert f["TUNE"] == "ok" and f["CASE"] == "2" and f["DEVICE"] == "cpu" and f["CONFIGS"] == "3/3"
    assert f["CORRECT"] == "True" and f["CONFIGS_CORRECT"] == "2" and f["STATUS"] == "ok"
    win = assert_reported_as_recorded(c)
    assert f["CONFIG"] == config_token(c["config"]) and win["index"] in (0, 1)
    by = {x["index"]: x for x in c["configs"]}
    assert by[2]["status"] == "crash" and "died" in by[2]["message"] and not by[2]["correct"]
    assert by[0]["correct"] and by[1]["correct"] and by[0]["validation"]["trials"] >= 2
    # the last config crashed its child, so one more child paired the finalist with the default; config 1 is the
    # only correct one besides the default, so it is the finalist whatever the timings
    assert c["finalists"] == [[1]] and by[1]["paired_speedup"] > 0 and by[1]["paired_a"]["n"] >= 3
    assert by[0]["paired_speedup"] is None and by[2]["paired_speedup"] is None
    table = workspace / "results" / "torch" / "tuning.csv"
    rows = tuning.read(table).rows
    assert len(rows) == 1 and rows[0].config == c["config"] and rows[0].gain == pytest.approx(c["gain"])
    assert [rows[0].gain_lo, rows[0].gain_hi] == pytest.approx(c["gain_ci"] or [None, None], rel=1e-3)
    assert (rows[0].batch, rows[0].seqlen_bucket, rows[0].kv_heads, rows[0].gqa, rows[0].page_size) == (4, 2, 8, 4, 0)
    assert rows[0].default_runtime_ms > 0 and rows[0].runtime_ms > 0
    assert rows[0].candidate_id and len(rows[0].candidate_id) == 12 and rows[0].quick is True  # run with --quick
    assert rows[0].plan_version == "3" and rows[0].capacity == 2           # the candidate's PLAN_VERSION, its length
    q = dict(device="cpu", units=rows[0].units, dtype="fp16", head_dim=128, batch=3, seqlen_k=2, kv_heads=8,
             gqa=4, page_size=None, plan_version="3")
    assert tuning.lookup(table, **q) == c["config"]                         # a shape of its own bucket finds it
    assert tuning.lookup(table, **(q | {"batch": 5})) is None               # the next batch bucket does not
    assert tuning.lookup(table, **(q | {"plan_version": "2"})) is None      # nor another plan version
    led = load(CaseResult, workspace / "candidates.jsonl").rows
    assert len(led) == 1 and led[0].mode == "tune" and led[0].config == c["config"] and led[0].correct


def test_tune_pairs_only_the_top_finalists(workspace, tmp_path):
    """No crash: one child screens all three configs, then pairs the --finalists 1 fastest by its own screened
    medians with the default (the rule applied to what it recorded)."""
    cand = tmp_path / "passes.py"
    cand.write_text(CANDIDATE % "False")
    r = CliRunner().invoke(app, ["tune", "--case", "2", "--device", "cpu", "--candidate", str(cand), "--quick",
                                 "--finalists", "1", "--no-record", "--no-write", "--json"])
    assert r.exit_code == 0, r.output
    (c,) = json.loads(r.stdout)["cases"]
    by = {x["index"]: x for x in c["configs"]}
    fastest = min((1, 2), key=lambda i: by[i]["cold"]["median_ms"])
    assert c["finalists"] == [[fastest]] and by[fastest]["paired_speedup"] > 0
    assert by[3 - fastest]["paired_speedup"] is None and by[0]["paired_speedup"] is None
    assert assert_reported_as_recorded(c)["index"] in (0, fastest) and c["csv"] is None      # --no-write
    assert all(x["correct"] for x in c["configs"])


def test_tune_searches_a_held_out_draw_but_never_writes_it_to_the_table(workspace, tmp_path):
    """--case 100N --heldout-seed S searches draw N of that seed (cut to CPU size) with --no-write: its TUNE line says
    CASE:100N and its ledger row keeps the seed, the kind and the draw's shape. Without --no-write it is a usage error
    (a tuned row would grade the table, not the rule, in the next held-out verdict), and nothing is written."""
    from kopt import workloads

    cand = tmp_path / "passes.py"
    cand.write_text(CANDIDATE % "False")
    base = ["tune", "--case", "1002", "--heldout", "3", "--heldout-seed", "9", "--device", "cpu", "--candidate",
            str(cand), "--quick", "--finalists", "0"]
    r = CliRunner().invoke(app, base)
    assert r.exit_code == 2 and "case 1002 is a held-out draw" in r.output and "--no-write" in r.output, r.output
    assert not (workspace / "results").exists() and not (workspace / "candidates.jsonl").exists()

    want = workloads.draw(workloads.load(), 3, 9, cpu=True)[1]
    r = CliRunner().invoke(app, base + ["--no-write", "--json"])
    assert r.exit_code == 0, r.output
    (c,) = json.loads(r.stdout)["cases"]
    f = dict(x.split(":", 1) for x in c["line"].split())
    assert f["CASE"] == "1002" and f["TUNE"] == "ok" and c["csv"] is None
    assert not (workspace / "results" / "torch" / "tuning.csv").exists()
    (row,) = load(CaseResult, workspace / "candidates.jsonl").rows
    assert (row.mode, row.case, row.case_kind, row.heldout_seed) == ("tune", 1002, "heldout", 9)
    assert row.variant == want.variant.label() and row.shape == want.shape_label() and row.model == want.model


def test_tune_searches_the_configs_given_beside_the_default(workspace, tmp_path):
    """--config (repeated) replaces configs(case) by the candidate's default and the configs given, in that order; a
    config with a key the candidate does not declare is a usage error before any work."""
    cand = tmp_path / "passes.py"
    cand.write_text(CANDIDATE % "False")
    r = CliRunner().invoke(app, ["tune", "--case", "2", "--device", "cpu", "--candidate", str(cand), "--quick",
                                 "--finalists", "0", "--no-write", "--no-record", "--json",
                                 "--config", '{"passes": 2}', "--config", '{"passes": 3}'])
    assert r.exit_code == 0, r.output
    (c,) = json.loads(r.stdout)["cases"]
    assert [x["config"] for x in sorted(c["configs"], key=lambda x: x["index"])] == [
        {"passes": 6}, {"passes": 2}, {"passes": 3}]
    assert "CONFIGS:3/3" in c["line"] and "FINALIST:NA FINALIST_GAIN:NA FINALIST_CI:NA" in c["line"]  # none paired

    from conftest import REPO

    sol = REPO / "solution" / "tilelang" / "run_kernel.py"
    r = CliRunner().invoke(app, ["tune", "--case", "2", "--device", "cpu", "--candidate", str(sol), "--no-write",
                                 "--config", '{"num_splits": 2}', "--config", '{"splits": 2}'])
    assert r.exit_code == 2 and "unknown key splits" in r.output, r.output
    assert not (workspace / "candidates.jsonl").exists()


def test_candidate_without_configs_fails_cleanly(workspace, tmp_path):
    from conftest import CANDIDATES

    r = CliRunner().invoke(app, ["tune", "--case", "2", "--device", "cpu", "--quick", "--no-record",
                                 "--candidate", str(CANDIDATES / "torch_honest.py")])
    assert r.exit_code == 1
    assert "STATUS:failed" in r.stdout and "configs(case)" in r.stdout
    assert not (workspace / "results").exists()


def test_tune_usage_errors(workspace):
    for args, msg in ([["tune"], "--case"], [["tune", "--case", "99"], "valid ids"],
                      [["tune", "--case", "1", "--gpus", "x"], "--gpus"]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 2 and msg in str(r.exception) + r.output, (args, r.output)
