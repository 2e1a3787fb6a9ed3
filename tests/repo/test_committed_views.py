"""The committed plots and report are current: regenerated from the committed ledger, they name the
same candidate, verdict and number of cases, and the same set of figures (kopt commit and the
campaign script regenerate them; this catches a commit that did not)."""

from __future__ import annotations

import re

from conftest import REPO

RESULTS = REPO / "results" / "tilelang"


def _report_meta(path) -> dict:
    return dict(re.findall(r"<meta name='(kopt-[a-z-]+)' content='([^']*)'>", path.read_text()))


def test_committed_plots_and_report_match_the_ledger(tmp_path):
    from kopt.report import build
    from kopt.report.campaign import load_campaign
    from kopt.report.plot import make_plots, png_text

    c = load_campaign(REPO)
    fresh = make_plots(REPO, tmp_path / "plots", campaign=c)
    page = build(REPO, tmp_path / "report.html", campaign=c, plots=fresh)
    want = c.marker()
    assert sorted(p.name for p in (RESULTS / "plots").glob("*.png")) == sorted(p.name for p in fresh), \
        "committed figures differ from what kopt plot writes: run `kopt plot && kopt report`"
    for p in fresh:
        got = {k: v for k, v in png_text(RESULTS / "plots" / p.name).items() if k in want}
        assert got == want, f"results/tilelang/plots/{p.name} is stale: run `kopt plot`"
    committed, regenerated = _report_meta(RESULTS / "report.html"), _report_meta(page)
    assert committed == regenerated, "results/tilelang/report.html is stale: run `kopt report`"
    assert committed["kopt-cases"] == str(len(c.rows)) and committed["kopt-candidate"] == c.best_id


def test_the_report_screenshot_is_not_committed():
    """report.html is the committed view; its PNG screenshot (1 MB of pixels of the same page) is git-ignored."""
    import subprocess

    tracked = subprocess.run(["git", "ls-files", "--", "results"], cwd=REPO, capture_output=True, text=True)
    if tracked.returncode != 0:
        import pytest

        pytest.skip("not a git checkout")
    assert not [p for p in tracked.stdout.splitlines() if p.endswith("report.png")]
    ignored = subprocess.run(["git", "check-ignore", "-q", "results/tilelang/report.png"], cwd=REPO)
    assert ignored.returncode == 0


def test_committed_status_md_matches_the_ledger():
    """results/STATUS.md (the README's link for where the kernel stands) is what `kopt report` writes from the
    committed ledger and results/hardware-*.json."""
    from kopt.report.status_md import STATUS_REL, markdown

    assert (REPO / STATUS_REL).read_text() == markdown(REPO), \
        "results/STATUS.md is stale: run `kopt report` (kopt commit does it too)"
