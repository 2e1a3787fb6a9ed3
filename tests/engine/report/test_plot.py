"""`kopt plot` from a synthetic ledger: valid PNG files, trajectory from verdict rows."""

from __future__ import annotations

import json
import uuid

from typer.testing import CliRunner

from kopt.cli.main import app
from kopt.paths import ledger_file
from kopt.records import CaseResult
from kopt.store import ledger

PNG = b"\x89PNG\r\n\x1a\n"
runner = CliRunner()


def rows(cid: str, speedups: dict[int, float], day: int, correct: bool = True) -> list[CaseResult]:
    """Verdict rows of one candidate: runtime 0.1 ms x case, speedup as given, a CI around it."""
    out = []
    for case, s in speedups.items():
        rt = 0.01 * case
        out.append(CaseResult(row_id=uuid.uuid4().hex, timestamp=f"2026-01-{day:02d}T00:00:{case:02d}+00:00",
                              mode="verdict", candidate_id=cid, candidate_hash=cid * 5, case=case,
                              variant="fp16-d128-contig-full", backend="tilelang", compiled=True, correct=correct,
                              status="ok" if correct else "incorrect_numerical", runtime_ms=rt, ref_runtime_ms=rt * s,
                              speedup=s, speedup_ci=(s * 0.97, s * 1.03), gbps=3000.0 * s / 2, pct_peak=70.0 * s / 2,
                              device="H200", ref="flash_attn-2.8.3"))
    return out


def write_ledger(ws) -> None:
    ledger.append(ledger_file(ws), rows("aaaaaaaaaaaa", {9: 0.8, 10: 0.9, 12: 1.0}, 1))
    ledger.append(ledger_file(ws), rows("bbbbbbbbbbbb", {9: 1.2, 10: 1.5, 12: 1.1}, 2))
    ledger.append(ledger_file(ws), rows("cccccccccccc", {9: 1.1, 10: 1.2, 12: 1.0}, 3))
    ledger.append(ledger_file(ws), rows("dddddddddddd", {9: 1.3}, 4, correct=False))


def test_load_campaign(workspace):
    from kopt.report.plot import load_campaign

    write_ledger(workspace)
    c = load_campaign(workspace)
    # No solution/ in this workspace: the top-ranked candidate is shown, and says so.
    assert c.best_id == "bbbbbbbbbbbb" and c.shown.source == "ledger best"
    assert [r.case for r in c.rows] == list(range(1, 22))                  # every case of the matrix
    by = {r.case: r for r in c.rows}
    assert [k for k, r in by.items() if r.basis == "verdict"] == [9, 10, 12]
    assert by[10].c500_ref_ms == 0.062 and by[10].ci[0] < 1.5 < by[10].ci[1]
    assert by[1].basis is None and by[1].na["runtime_ms"].startswith("not measured")
    assert by[10].na == {"pct_limit": "not measured: rows before the limit was recorded"}
    assert c.ceiling_gbps is not None and abs(c.ceiling_gbps - 3000 / 70 * 100) < 1e-6 and c.ceiling_kind == "copy"
    assert c.trajectory_source.startswith("ledger")
    assert [p.outcome for p in c.trajectory] == ["improved", "improved", "not improved", "failed"]
    assert c.backend == "tilelang"
    assert c.marker()["kopt-candidate"] == "bbbbbbbbbbbb" and c.marker()["kopt-cases"] == "21"


def test_plot_writes_pngs_naming_the_candidate(workspace):
    from kopt.report.plot import png_text

    write_ledger(workspace)
    plots = workspace / "results" / "tilelang" / "plots"
    plots.mkdir(parents=True)
    (plots / "bandwidth.png").write_bytes(PNG)                  # a figure of the old layout: removed
    r = runner.invoke(app, ["plot", "--json"])
    assert r.exit_code == 0, r.output
    files = json.loads(r.stdout)["files"]
    assert [f.rsplit("/", 1)[1] for f in files] == ["speedup.png", "roofline.png", "trajectory.png"]
    for f in files:
        assert f.startswith(str(plots))
        with open(f, "rb") as fh:
            assert fh.read(8) == PNG
        meta = png_text(f)
        assert meta["kopt-candidate"] == "bbbbbbbbbbbb" and meta["kopt-cases"] == "21", meta
    assert not (plots / "bandwidth.png").exists() and not (plots / "peers.png").exists()
    first = [open(f, "rb").read() for f in files]
    runner.invoke(app, ["plot"])
    assert [open(f, "rb").read() for f in files] == first     # same data, same bytes: no spurious diffs


def test_peer_rows_get_a_panel(workspace):
    """The newest `kopt peers` run of each device: its panel redrawn as peers-<device>.png, stamped."""
    from kopt.report.plot import load_campaign, png_text

    write_ledger(workspace)

    def peer(name, sp):
        t = {"method": "cupti", "median_ms": 0.02, "noisy": False}
        return {"peer": name, "ref": f"{name}-1.0", "correct": True, "timing": t,
                "ref_timing": {**t, "median_ms": 0.02 * sp}, "speedup": sp, "speedup_ci": [sp * 0.99, sp * 1.01]}

    runs = [dict(row_id=uuid.uuid4().hex, run_id=run, mode="peers", kind="case", candidate_id="bbbbbbbbbbbb",
                 case=c, variant="fp16-d128-contig-full", runtime_ms=0.02, device="H200", status="ok",
                 timestamp="2026-01-05T00:00:00+00:00", peers=[peer("fa2", sp), peer("fa3", sp / 2)])
            for run, sp in (("old", 9.0), ("new", 1.5)) for c in (9, 10)]
    with open(ledger_file(workspace), "a") as f:              # raw rows, as kopt peers writes them
        f.writelines(json.dumps(r) + "\n" for r in runs)
    c = load_campaign(workspace)
    assert list(c.peers) == ["h200"] and c.peers["h200"].run_id == "new" and len(c.peers["h200"].rows) == 2
    r = runner.invoke(app, ["plot", "--json"])
    png = json.loads(r.stdout)["files"][-1]
    assert png.endswith("plots/peers-h200.png") and png_text(png)["kopt-candidate"] == "bbbbbbbbbbbb"
    assert runner.invoke(app, ["report"]).exit_code == 0
    text = (workspace / "results" / "tilelang" / "report.html").read_text()
    assert "<h2>Peers</h2>" in text and "data-img='peers-h200'" in text and "No peer rows yet" not in text


def test_plot_empty_ledger_and_out_dir(workspace, tmp_path):
    out = tmp_path / "figs"
    r = runner.invoke(app, ["plot", "--out", str(out)])
    assert r.exit_code == 0, r.output
    for name in ("speedup.png", "roofline.png", "trajectory.png"):
        assert (out / name).read_bytes()[:8] == PNG
