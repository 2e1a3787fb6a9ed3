"""One shown candidate everywhere: status, candidates, the report, the plots and results/STATUS.md name the same
shipped candidate, the same best by the rule and the same first of the ranking, in their first line, with why they
differ; a peer panel of another candidate is marked stale where it is shown; the report dates each device apart."""

from __future__ import annotations

import html
import json
import re

from test_shown import PERF, noisy_older_ledger, row, shipped  # noqa: F401  (shipped: a fixture)

from conftest import kopt, peer_rows
from kopt.paths import ledger_file
from kopt.store import ledger


def _fixture(ws, cid: str) -> None:
    """The shipped candidate's verdict; an older one better by the rule; a bench-only third ranked first; a peer
    panel of a fourth candidate from 2026-12-01; a CPU row newer than everything."""
    noisy_older_ledger(ws, cid)
    ledger.append(ledger_file(ws), [row("cccccccccccc", c, 2.5, mode="signal", run="b-ccc") for c in PERF])
    with open(ledger_file(ws), "a") as f:
        for r in peer_rows():
            f.write(json.dumps(r) + "\n")
        f.write(json.dumps({"mode": "signal", "kind": "case", "case": 2, "device": "cpu", "candidate_id": cid,
                            "timestamp": "2099-01-01T00:00:00+00:00", "status": "ok"}) + "\n")


def _report_headline(page: str) -> str:
    return html.unescape(re.search(r"data-headline='1'><b>([^<]*)</b>", page).group(1))


def test_status_candidates_report_and_status_md_agree(workspace, shipped):  # noqa: F811
    from kopt.report.plot import png_text

    _fixture(workspace, shipped)
    first = kopt("status", "--no-record").stdout.splitlines()[0]
    assert first.startswith(f"shipped {shipped} (")
    assert "best by the improvement rule: 0ld0ld0ld0ld (iteration 1), as the rule judged the shipped one not " \
           "improved" in first
    assert "first in the ranking by uniform geomean: cccccccccccc (2.500x, bench rows), no iteration holds it, " \
           "so the rule never judged it" in first
    assert kopt("candidates").stdout.splitlines()[0] == first
    st = json.loads(kopt("status", "--json", "--no-record").stdout)["shown"]
    assert st["headline"] == first
    assert (st["candidate_id"], st["rule_best"], st["ranked_first"]["candidate_id"]) == \
           (shipped, "0ld0ld0ld0ld", "cccccccccccc")
    assert json.loads(kopt("candidates", "--json").stdout)["shown"]["candidate_id"] == shipped

    r = kopt("report")
    assert r.exit_code == 0, r.output
    page = (workspace / "results" / "tilelang" / "report.html").read_text()
    assert _report_headline(page) == first
    assert f"<meta name='kopt-candidate' content='{shipped}'>" in page
    assert "<meta name='kopt-rule-best' content='0ld0ld0ld0ld'>" in page
    # the panel timed candidate abc on 2026-12-01: stale, with its candidate and its age, where it is shown
    assert "data-stale='abc'" in page and "stale: this panel timed candidate abc on 2026-12-01" in html.unescape(page)
    assert re.search(r"\d+ days before the shown candidate's verdict", html.unescape(page))
    # the header dates each device by its own newest row: the CPU row of 2099 does not date the H200 rows
    head = re.search(r"newest ledger row per device: ([^;]*; [^;.]*)", page).group(1)
    assert head.startswith("cpu 2099-01-01") and "H200 " in head and "H200 2099" not in head
    plots = workspace / "results" / "tilelang" / "plots"
    for p in plots.glob("*.png"):
        meta = png_text(p)
        assert meta["kopt-candidate"] == shipped and meta["kopt-rule-best"] == "0ld0ld0ld0ld", p.name
    status_md = (workspace / "results" / "STATUS.md").read_text()
    assert first + "." in status_md and "stale: this panel timed candidate abc" in status_md


def test_a_panel_of_the_shown_candidate_is_not_stale(workspace, shipped):  # noqa: F811
    from kopt.report.campaign import load_campaign

    noisy_older_ledger(workspace, shipped)
    with open(ledger_file(workspace), "a") as f:
        for r in peer_rows():
            f.write(json.dumps({**r, "candidate_id": shipped}) + "\n")
    c = load_campaign(workspace)
    assert [p.stale for p in c.peers.values()] == [""]


def test_without_other_candidates_the_first_line_says_so(workspace, shipped):  # noqa: F811
    ledger.append(ledger_file(workspace), [row(shipped, c, 1.5, run="v-new") for c in PERF])
    first = kopt("status", "--no-record").stdout.splitlines()[0]
    assert first.startswith(f"shipped {shipped} (iteration 1") and first.endswith(
        "also the best by the improvement rule; also first in the ranking")


def test_status_md_of_a_candidate_without_a_verdict_says_it_has_none(workspace, shipped):  # noqa: F811
    """Only bench rows of the shipped candidate: STATUS.md says it has no verdict, and its held-out line says the same
    (not that a verdict predates the workload library)."""
    ledger.append(ledger_file(workspace), [row(shipped, c, 1.5, mode="signal", run="b-1") for c in PERF])
    r = kopt("report")
    assert r.exit_code == 0, r.output
    md = (workspace / "results" / "STATUS.md").read_text()
    assert "| its verdict | none yet: run `kopt verify` |" in md
    assert "| held-out draws (the number to move) | NA: no verdict yet; run `kopt verify` |" in md
    assert "predates" not in md


def test_the_ranking_beside_the_shipped_candidate_is_over_its_own_device(workspace, shipped):  # noqa: F811
    """A CPU screen's 4x is no rank against H200 verdicts: the first line names the first of the H200 ranking, every
    view says the same, and `kopt candidates` ranks the shipped candidate's device unless --device names another."""
    _fixture(workspace, shipped)
    ledger.append(ledger_file(workspace), [row("cpu0cpu0cpu0", c, 4.0, mode="signal", run="b-cpu", device="cpu")
                                           for c in PERF])
    first = kopt("status", "--no-record").stdout.splitlines()[0]
    assert "first in the ranking by uniform geomean: cccccccccccc (2.500x, bench rows)" in first
    assert "cpu0cpu0cpu0" not in first
    assert kopt("candidates").stdout.splitlines()[0] == first
    assert json.loads(kopt("status", "--json", "--no-record").stdout)["shown"]["headline"] == first
    table = json.loads(kopt("candidates", "--json").stdout)  # the table agrees with its first line
    assert table["device"] == "H200" and table["candidates"][0]["candidate_id"] == "cccccccccccc"
    assert "cpu0cpu0cpu0" not in [c["candidate_id"] for c in table["candidates"]]
    cpu = json.loads(kopt("candidates", "--json", "--device", "cpu").stdout)
    assert cpu["device"] == "cpu" and cpu["candidates"][0]["candidate_id"] == "cpu0cpu0cpu0"


def test_status_md_and_the_report_say_where_the_held_out_geomean_is_lost(workspace, shipped):  # noqa: F811
    """The shown verdict's held-out draws by the plan each ran: STATUS.md's table and the report's, lowest first, with
    the held-out geomean were that plan's draws at their limit; no such table without held-out rows."""
    noisy_older_ledger(workspace, shipped)
    r = kopt("report")
    assert r.exit_code == 0, r.output
    assert "Where the held-out geomean is lost" not in (workspace / "results" / "STATUS.md").read_text()
    held = [row(shipped, 1000 + i, 1.2, run="v-new", case_kind="heldout", heldout_seed=5, pct_limit=pct,
                limit_ms=0.05, plan={"kernel": kernel, "block_N": 64})
            for i, (pct, kernel) in enumerate([(40.0, "decode_direct"), (90.0, "decode_direct"),
                                               (50.0, "decode_split_combine")], 1)]
    ledger.append(ledger_file(workspace), held)
    r = kopt("report")
    assert r.exit_code == 0, r.output
    md = (workspace / "results" / "STATUS.md").read_text()
    table = md.split("Where the held-out geomean is lost", 1)[1]
    # split_combine: 50%; were it at 100%, the three draws' geomean is (40 x 90 x 100) ** (1 / 3) = 71.1%
    assert "| split_combine | 1 | 50.0% | 1003 (seed 5): 50.0% | 71.1% |" in table
    assert "| direct | 2 | 60.0% | 1001 (seed 5): 40.0% | 79.4% |" in table  # (100 x 100 x 50) ** (1 / 3)
    assert table.index("| split_combine |") < table.index("| direct |")
    page = html.unescape((workspace / "results" / "tilelang" / "report.html").read_text())
    assert "Where the held-out geomean is lost" in page and "1001 (seed 5): 40.0" in page
