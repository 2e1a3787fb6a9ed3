"""`kopt report`: one self-contained HTML file from a synthetic ledger and a profile summary."""

from __future__ import annotations

import base64
import re

from test_plot import PNG, write_ledger
from typer.testing import CliRunner

from kopt.cli.main import app
from kopt.profile import diagnosis as dg
from kopt.profile.models import KernelMetrics, ProfileSummary, Tool

runner = CliRunner()


def write_summary(ws, stamp: str, created: str, case: int, config=None) -> None:
    k = KernelMetrics(name="decode_split_kernel", metrics={"grid_size": 32.0, "waves_per_sm": 0.2, "dram_pct": 30.0,
                                                           "duration_ns": 9000.0})
    d = dg.diagnose(dg.Evidence(kernels=[k], units=132, kv_bytes=1 << 24, ideal_bytes=1 << 24))
    out = ws / "results" / "tilelang" / "profiling" / f"case{case}" / stamp
    out.mkdir(parents=True)
    s = ProfileSummary(case=case, tool=Tool.ncu, created=created, kernels=[k], diagnosis=d, device_name="H200",
                       candidate_id="bbbbbbbbbbbb", notes=["a <note> & more"], config=config)
    (out / "summary.json").write_text(s.model_dump_json())


def test_report_html(workspace):
    write_ledger(workspace)
    write_summary(workspace, "20260101T000000", "2026-01-01T00:00:00+00:00", 12)
    write_summary(workspace, "20260102T000000", "2026-01-02T00:00:00+00:00", 10)
    r = runner.invoke(app, ["report", "--json"])
    assert r.exit_code == 0, r.output
    path = workspace / "results" / "tilelang" / "report.html"
    assert str(path) in r.stdout
    html = path.read_text()
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    imgs = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", html)
    assert len(imgs) == 3 and all(base64.b64decode(i)[:8] == PNG for i in imgs)
    assert "http" not in html.replace("http-equiv", "")            # self-contained: nothing fetched
    assert "<meta name='kopt-candidate' content='bbbbbbbbbbbb'>" in html and "name='kopt-cases' content='21'" in html
    assert html.count("class='case' data-case=") == 21             # every case of the matrix has a row
    assert "C500 ref ms" in html and "reference data from another device" in html
    assert "not measured: rows before the limit was recorded" in html
    assert "case 10" in html and "tail effect" in html           # the newest summary is the one shown
    assert "a &lt;note&gt; &amp; more" in html                  # escaped
    assert "No peer rows yet" in html
    runner.invoke(app, ["report"])
    assert path.read_text() == html                              # no clock in it: same data, same file


def test_report_shows_the_own_plan_profile_before_a_newer_variant(workspace):
    """The latest diagnosis is the newest profile of a candidate's own plan: a newer `kopt profile --config`
    run (a variant) is not it; with only variants, the newest variant, named as one."""
    from kopt.report import latest_summary

    write_summary(workspace, "20260101T000000", "2026-01-01T00:00:00+00:00", 12)
    write_summary(workspace, "20260103T000000", "2026-01-03T00:00:00+00:00", 10, config={"tma": 2})
    assert latest_summary(workspace).parts[-3:-1] == ("case12", "20260101T000000")
    r = runner.invoke(app, ["report"])
    assert r.exit_code == 0, r.output
    html = (workspace / "results" / "tilelang" / "report.html").read_text()
    assert "case 12" in html and "a variant" not in html
    for p in (workspace / "results" / "tilelang" / "profiling" / "case12").rglob("summary.json"):
        p.unlink()
    assert latest_summary(workspace).parts[-3:-1] == ("case10", "20260103T000000")
    runner.invoke(app, ["report"])
    html = (workspace / "results" / "tilelang" / "report.html").read_text()
    assert "config <code>{&quot;tma&quot;: 2}</code> (a variant, not the candidate" in html


def test_report_without_data(workspace, tmp_path):
    out = tmp_path / "r.html"
    r = runner.invoke(app, ["report", "--out", str(out)])
    assert r.exit_code == 0, r.output
    html = out.read_text()
    assert "No candidate rows" in html and "No profile yet" in html and html.count("data:image/png;base64,") == 3
    assert html.count("class='case' data-case=") == 21 and "content='none'" in html


def test_screenshot_without_a_browser_is_a_usage_error(workspace, monkeypatch):
    from kopt.report import browser

    monkeypatch.setattr(browser, "find", lambda: None)
    r = runner.invoke(app, ["report", "--screenshot"])
    assert r.exit_code == 2 and "headless Chromium" in r.stderr
