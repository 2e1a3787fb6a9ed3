"""The shell wrappers in scripts/ parse, are executable, and go through kopt (no logic of their own)."""

import subprocess
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[1] / "scripts").glob("*.sh"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_script_parses_and_calls_kopt(script):
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    assert script.stat().st_mode & 0o111, f"{script.name} is not executable"
    assert "kopt" in script.read_text()


def test_campaign_skips_steps_past_its_budget(tmp_path):
    """With no budget left every step is skipped, and the archive is still written."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "h200_campaign.sh"
    p = subprocess.run(["bash", str(script), str(tmp_path / "out"), "doctor", "bench"], capture_output=True,
                       text=True, env={"PATH": "/usr/bin:/bin", "CAMPAIGN_BUDGET_S": "0"}, cwd=tmp_path)
    steps = (tmp_path / "out" / "logs" / "steps.txt").read_text()
    assert "doctor skipped (budget)" in steps and "bench_fp16 skipped (budget)" in steps
    assert (tmp_path / "out" / "campaign.tgz").exists(), p.stderr
