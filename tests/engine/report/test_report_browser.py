"""The HTML report in a real browser (headless Chromium): every case row is there, measured cells hold
numbers, NA cells give a reason, every image loaded; and a screenshot is written.

Skipped, with a message, where no Chromium is installed (Debian: `apt-get install chromium`)."""

from __future__ import annotations

import uuid

import pytest

from conftest import REPO, kopt
from kopt.paths import ledger_file
from kopt.records import CaseResult
from kopt.report import browser
from kopt.store import ledger
from kopt.store.vcs import candidate_hash

pytestmark = pytest.mark.skipif(browser.find() is None,
                                reason="no headless Chromium (apt-get install chromium): browser check skipped")
PNG = b"\x89PNG\r\n\x1a\n"


def full_rows(cid: str) -> list[CaseResult]:
    """A shipped candidate measured on every case: a verdict on perf and ragged cases, bench rows on edge cases."""
    from kopt.cases import load_cases
    from kopt.paths import cases_file

    out = []
    for c in load_cases(cases_file()):
        s = 1.1 + c.id / 20
        out.append(CaseResult(row_id=uuid.uuid4().hex, run_id="bench" if c.kind == "edge" else "verdict",
                              mode="signal" if c.kind == "edge" else "verdict", candidate_id=cid, case=c.id,
                              variant=c.variant.label(), backend="tilelang", compiled=True, correct=True,
                              runtime_ms=0.01 * c.id, ref_runtime_ms=0.01 * c.id * s, speedup=s,
                              speedup_ci=(s - 0.01, s + 0.01), gbps=100.0 * c.id, pct_peak=2.0 * c.id,
                              limit_ms=0.005 * c.id, pct_limit=50.0, device="H200", ref="flash_attn-2.8.3",
                              commit="abc1234"))
    return out


def test_report_in_chromium(workspace):
    sol = workspace / "solution" / "tilelang" / "run_kernel.py"
    sol.parent.mkdir(parents=True)
    sol.write_text("BACKEND = 'tilelang'\n")
    cid = candidate_hash(sol)[1]
    ledger.append(ledger_file(workspace), full_rows(cid))
    r = kopt("report", "--screenshot", "--json")
    assert r.exit_code == 0, r.output
    page = workspace / "results" / "tilelang" / "report.html"
    shot = page.with_suffix(".png")
    assert shot.read_bytes()[:8] == PNG and shot.stat().st_size > 10_000
    d = browser.check(browser.dump_dom(page))
    from kopt.cases import load_cases

    n = len(load_cases())                                                     # every named case
    assert d.meta["kopt-candidate"] == cid and d.meta["kopt-cases"] == str(n)
    assert d.cases == list(range(1, n + 1))
    assert d.measured == n * 7 and d.bad_numbers == [] and d.na == {}         # every figure measured: no NA
    assert d.images == {"speedup": "loaded", "roofline": "loaded", "trajectory": "loaded"}
    assert d.images_summary == "3/3" and d.height > 1000


def test_committed_report_in_chromium():
    """The committed report: every case, numbers in measured cells, a reason on every NA, images loaded."""
    page = REPO / "results" / "tilelang" / "report.html"
    d = browser.check(browser.dump_dom(page))
    assert d.cases == list(range(1, int(d.meta["kopt-cases"]) + 1)) and d.bad_numbers == []
    assert all(why.startswith("not measured") for cells in d.na.values() for _, why in cells)
    measured = [c for c, b in d.basis.items() if b != "none"]
    # A measured row's NA can only be a figure its row predates (the roofline limit) or one its device has no
    # measured ceiling for (a CPU row's % of ceiling), never a timing.
    assert all(f == "pct_limit" or (f == "pct_peak" and "no measured ceiling" in why)
               for c in measured for f, why in d.na.get(c, [])), d.na
    assert set(d.images.values()) == {"loaded"} and d.images_summary.startswith(f"{len(d.images)}/")
