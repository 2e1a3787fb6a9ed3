"""`kopt candidates`: geomean ranking, best per case, lineage, old-schema rows, 10 000-row speed."""

from __future__ import annotations

import csv
import io
import json
import math
import random
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kopt.cli.main import app
from kopt.errors import KoptError
from kopt.policy import ranking


def kopt(*args: str):
    res = CliRunner().invoke(app, [str(a) for a in args])
    assert res.exit_code == 0, (res.stdout, repr(res.exception))
    return res


def row(cid, case, rt, ref=0.1, mode="verdict", correct=True, **kw) -> dict:
    return {"schema_version": 1, "row_id": f"{cid}-{case}-{rt}", "mode": mode, "kind": "case", "candidate_id": cid,
            "case": case, "variant": "", "correct": correct, "status": "ok" if correct else "incorrect_numerical",
            "runtime_ms": rt, "ref_runtime_ms": ref, "speedup": None if rt is None else ref / rt, **kw}


def write(path: Path, rows: list) -> None:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


@pytest.fixture
def ledger(workspace) -> Path:
    rows = [
        row("aaa", 1, 0.10), row("aaa", 2, 0.10),                                   # geomean 1.0
        row("bbb", 1, 0.05, parent_id="aaa"), row("bbb", 2, 0.20, parent_id="aaa"),  # geomean 1.0 ... then better
        row("bbb", 2, 0.10, parent_id="aaa"),                                       # latest verdict wins: 2 x 1
        row("ccc", 1, 0.04, mode="signal", parent_id="bbb", technique="split-kv"),   # signal only: 2.5
        row("ddd", 1, 0.01), row("ddd", 2, 0.5, correct=False),                      # fast but wrong on case 2
        row("eee", 1, 0.02, mode="calibrate"),                                      # not a candidate row
        {"row_id": "old", "candidate_hash": "fff" * 10, "case": 1, "runtime_ms": 0.08,  # schema 0: no mode,
         "ref_runtime_ms": 0.1, "correct": True},                                   # no id, no speedup
        {"kind": "stagnation", "row_id": "s", "candidate_id": "aaa", "case": 0},
        "{torn line",
    ]
    p = workspace / "candidates.jsonl"
    write(p, rows)
    return p


def test_rank_geomean_basis_and_order(ledger):
    df, skipped = ranking.load_frame(ledger)
    assert skipped == [(12, "torn or invalid JSON")]
    r = {x["candidate_id"]: x for x in ranking.records(ranking.rank(df))}
    assert r["bbb"]["geomean"] == pytest.approx(math.sqrt(2.0 * 1.0)) and r["bbb"]["n_cases"] == 2
    assert r["ccc"]["basis"] == "signal" and r["ccc"]["geomean"] == pytest.approx(2.5)
    assert r["ffffffffffff"]["geomean"] == pytest.approx(1.25) and r["ffffffffffff"]["basis"] == "signal"
    assert r["ddd"]["n_incorrect"] == 1 and "eee" not in r
    order = list(ranking.rank(df)["candidate_id"])
    assert order == ["ccc", "bbb", "ffffffffffff", "aaa", "ddd"], "an incorrect candidate ranks last"


def test_best_per_case_and_case_ranking(ledger):
    df, _ = ranking.load_frame(ledger)
    best = {int(x["case"]): x["candidate_id"] for x in ranking.records(ranking.best_per_case(df))}
    assert best == {1: "ddd", 2: "aaa"}          # ddd's case-1 row is correct; bbb's 0.10 ties aaa, aaa first
    one = ranking.case_ranking(df, 1)
    assert list(one["candidate_id"])[:3] == ["ddd", "ccc", "bbb"]


def test_lineage(ledger):
    df, _ = ranking.load_frame(ledger)
    assert ranking.lineage(ranking.parents(df), "ccc") == ["ccc", "bbb", "aaa"]
    assert ranking.lineage({"a": "b", "b": "a"}, "a") == ["a", "b"], "cycles stop"


def test_cli_json_csv_top_case(ledger):
    data = json.loads(kopt("candidates", "--json", "--top", "2").stdout)
    assert [c["candidate_id"] for c in data["candidates"]] == ["ccc", "bbb"]
    assert data["candidates"][0]["lineage"] == "ccc <- bbb <- aaa" and data["skipped_lines"] == 1
    rows = list(csv.DictReader(io.StringIO(kopt("candidates", "--csv").stdout)))
    assert rows[0]["candidate_id"] == "ccc" and {"rank", "geomean", "n_cases", "lineage"} <= set(rows[0])
    case = json.loads(kopt("candidates", "--case", "2", "--json").stdout)
    assert [c["candidate_id"] for c in case["candidates"]] == ["aaa", "bbb"] and case["case"] == 2
    assert "ccc" in kopt("candidates").stdout
    res = CliRunner().invoke(app, ["candidates", "--json", "--csv"])
    code = res.exception.exit_code if isinstance(res.exception, KoptError) else res.exit_code
    assert code == 2


def test_empty_ledger(workspace):
    assert "no candidate rows" in kopt("candidates").stdout
    assert json.loads(kopt("candidates", "--json").stdout)["candidates"] == []


def test_ten_thousand_rows_under_two_seconds(workspace, capsys):
    rnd = random.Random(0)
    rows, ids = [], [f"{i:012x}" for i in range(400)]
    for k in range(10_000):
        cid = ids[k % 400]
        r = row(cid, rnd.randint(1, 14), rnd.uniform(0.02, 0.6), ref=rnd.uniform(0.03, 0.6),
                mode=rnd.choice(["verdict", "signal", "tune"]), correct=rnd.random() > 0.05,
                parent_id=ids[(k % 400) - 1] if k % 400 else None, timing={"method": "cupti", "median_ms": 0.1})
        if k % 7 == 0:                                   # an older schema: fewer fields
            r = {key: r[key] for key in ("row_id", "candidate_id", "case", "runtime_ms", "correct")}
        rows.append(r)
    write(workspace / "candidates.jsonl", rows)
    t0 = time.perf_counter()
    res = kopt("candidates", "--json")
    t_json = time.perf_counter() - t0
    data = json.loads(res.stdout)
    assert len(data["candidates"]) == 400 and len(data["best_per_case"]) == 14
    t0 = time.perf_counter()
    assert "first 20" in kopt("candidates").stdout
    t_text = time.perf_counter() - t0
    with capsys.disabled():
        print(f"\n  kopt candidates on 10 000 rows: --json {t_json:.2f} s, table {t_text:.2f} s")
    assert t_json < 2.0 and t_text < 2.0


def test_device_filter_keeps_devices_apart(tmp_path):
    """Times from different devices never mix in one ranking."""
    from kopt.policy.ranking import report
    from kopt.records import CaseResult
    from kopt.store.ledger import append

    f = tmp_path / "c.jsonl"
    append(f, [CaseResult(row_id="a", candidate_id="gpu", case=1, correct=True, runtime_ms=1.0, ref_runtime_ms=2.0,
                          speedup=2.0, device="H200"),
               CaseResult(row_id="b", candidate_id="cpu", case=1, correct=True, runtime_ms=1.0, ref_runtime_ms=3.0,
                          speedup=3.0, device="cpu")])
    assert list(report(f, device="H200").candidates["candidate_id"]) == ["gpu"]
    assert list(report(f, device="cpu").candidates["candidate_id"]) == ["cpu"]
    assert list(report(f).candidates["candidate_id"]) == ["cpu", "gpu"]


def test_heldout_by_plan_says_where_the_geomean_is_lost():
    """The correct held-out rows grouped by the kernel their plan ran, "floor" where the row's limit is the launch
    floor, lowest geomean first: each group's geomean % of the limit, its lowest draw, and the geomean over every
    draw were that group's draws at their limit. Rows without a % of the limit, incorrect rows and other groups stay
    out; a row without a plan is "NA"."""
    from kopt.policy.ranking import heldout_by_plan

    def held(case, pct, kernel, limit_ms, **kw):
        return {"case": case, "case_kind": "heldout", "correct": True, "pct_limit": pct, "limit_ms": limit_ms,
                "heldout_seed": 7, "plan": {"kernel": kernel} if kernel else None, **kw}

    rows = [held(1001, 40.0, "decode_direct", 0.0029), held(1002, 90.0, "decode_direct", 0.0029),
            held(1003, 50.0, "decode_balanced", 0.120), held(1004, 80.0, None, 0.05),
            held(1005, 10.0, "decode_direct", 0.0029, correct=False),
            held(1006, None, "decode_direct", 0.0029), {"case": 4, "case_kind": "perf", "correct": True,
                                                         "pct_limit": 5.0, "plan": {"kernel": "decode_direct"}}]
    groups = heldout_by_plan(rows, floor_ms=0.0029)
    assert [(g.plan, g.n) for g in groups] == [("balanced", 1), ("direct floor", 2), ("NA", 1)]
    assert groups[1].pct_limit == pytest.approx(60.0)  # sqrt(40 x 90)
    assert groups[1].lowest == {"case": 1001, "heldout_seed": 7, "pct_limit": 40.0}
    # all four draws' geomean were the direct draws at 100%: (100 x 100 x 50 x 80) ** (1 / 4)
    assert groups[1].heldout_at_limit == pytest.approx((100 * 100 * 50 * 80) ** 0.25)
    assert groups[0].heldout_at_limit == pytest.approx((40 * 90 * 100 * 80) ** 0.25)
    # without the floor the same draws are plain "direct"; without held-out rows, nothing
    assert [g.plan for g in heldout_by_plan(rows)] == ["balanced", "direct", "NA"]
    assert heldout_by_plan(rows[-1:]) == []
