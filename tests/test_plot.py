"""`kopt plot` from a synthetic ledger: valid PNG files, trajectory from verdict rows."""

from __future__ import annotations

import json
import uuid

from typer.testing import CliRunner

from kopt import ledger
from kopt.cli.main import app
from kopt.paths import ledger_file
from kopt.results import CaseResult

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
    from kopt.plot import load_campaign

    write_ledger(workspace)
    c = load_campaign(workspace)
    assert c.best_id == "bbbbbbbbbbbb" and c.basis == "verdict" and [r.case for r in c.rows] == [9, 10, 12]
    assert c.rows[1].c500_ref_ms == 0.062 and c.rows[1].ci[0] < 1.5 < c.rows[1].ci[1]
    assert c.ceiling_gbps is not None and abs(c.ceiling_gbps - 3000 / 70 * 100) < 1e-6
    assert c.trajectory_source.startswith("ledger")
    assert [p.outcome for p in c.trajectory] == ["improved", "improved", "not improved", "failed"]
    assert c.backend == "tilelang"


def test_plot_writes_pngs(workspace):
    write_ledger(workspace)
    r = runner.invoke(app, ["plot", "--json"])
    assert r.exit_code == 0, r.output
    files = json.loads(r.stdout)["files"]
    assert [f.rsplit("/", 1)[1] for f in files] == ["speedup.png", "bandwidth.png", "trajectory.png"]
    for f in files:
        assert f.startswith(str(workspace / "results" / "tilelang" / "plots"))
        with open(f, "rb") as fh:
            assert fh.read(8) == PNG


def test_plot_empty_ledger_and_out_dir(workspace, tmp_path):
    out = tmp_path / "figs"
    r = runner.invoke(app, ["plot", "--out", str(out)])
    assert r.exit_code == 0, r.output
    for name in ("speedup.png", "bandwidth.png", "trajectory.png"):
        assert (out / name).read_bytes()[:8] == PNG
