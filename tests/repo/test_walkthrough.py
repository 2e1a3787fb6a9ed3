"""A fresh agent's walkthrough, as an agent runs it: `kopt` processes, stdout lines parsed, exit codes read.
init -> iteration 1 (verdict) -> iteration 2 (bench only) -> iteration 3 (a broken edit) -> revert best -> status,
on the CPU with the shipped kernel. And the workspace `kopt init` makes cites only what it holds."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kopt.records import ANY_LINE

SRC = Path(__file__).resolve().parents[2] / "src"
KERNEL = Path("solution") / "tilelang" / "run_kernel.py"
BREAK = '''

_run = run


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None, config=None):
    return _run(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, config) * 0
'''

pytestmark = pytest.mark.usefixtures("git_env")


def kopt(ws: Path, *args: str, code: int = 0) -> list[str]:
    """`kopt ARGS` in the workspace, as an agent runs it: the exit code checked, stdout's lines returned."""
    env = {k: v for k, v in os.environ.items() if k != "KOPT_WORKSPACE"}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    p = subprocess.run([sys.executable, "-m", "kopt", *args], cwd=ws, env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == code, (args, p.stdout[-2000:], p.stderr[-2000:])
    return p.stdout.splitlines()


def fields(line: str) -> dict[str, str]:
    assert ANY_LINE.match(line), line
    return dict(f.split(":", 1) for f in line.split())


def test_init_three_iterations_revert_status(tmp_path, monkeypatch):
    monkeypatch.delenv("KOPT_WORKSPACE")
    ws = tmp_path / "agent"
    kopt(tmp_path, "init", str(ws))
    cf = yaml.safe_load((ws / "bench" / "cases.yaml").read_text())   # a CI-sized verdict: two tiny cases
    cf["verify"] = {"seeds": 1, "matrix": [], "hidden": 0, "heldout": 0}
    (ws / "bench" / "cases.yaml").write_text(yaml.safe_dump(cf))

    # iteration 1: a verdict of the shipped kernel
    out = kopt(ws, "verify", "--case", "1,2", "--device", "cpu", "--quick-timing", "--machine", "--technique",
               "baseline", "--hypothesis", "the shipped kernel passes")
    v = fields(out[-1])
    assert v["VERDICT"] == "pass" and v["CORRECT"] == "True" and v["ROWS_CORRECT"] == "2/2"
    kopt(ws, "log", "--title", "baseline", "--hypothesis", "h1", "--analysis", "a1", "--next", "n1")
    assert kopt(ws, "commit", "-m", "baseline")[0].startswith("[iter 1] baseline")
    first = (ws / KERNEL).read_text()

    # iteration 2: an edit measured by bench only: logged with its own rows, not judged
    (ws / KERNEL).write_text(first + "\n# iteration 2: a comment-only edit\n")
    lines = kopt(ws, "bench", "--case", "1", "--device", "cpu", "--quick", "--machine")
    assert [fields(x)["CORRECT"] for x in lines] == ["True"]
    kopt(ws, "log", "--title", "comment", "--hypothesis", "h2", "--analysis", "a2", "--next", "n2")
    kopt(ws, "commit", "-m", "comment")
    entry2 = (ws / "ITERATIONS.md").read_text().split("## Iteration 2")[1]
    assert fields(lines[0])["CANDIDATE"] in entry2 and "not judged" in entry2 and "improved" not in entry2

    # iteration 3: a broken edit; bench says so (exit 1, SPEEDUP NA); revert best records it, then reverts
    (ws / KERNEL).write_text(first + BREAK)
    bad = fields(kopt(ws, "bench", "--case", "1", "--device", "cpu", "--quick", "--machine", code=1)[0])
    assert bad["CORRECT"] == "False" and bad["SPEEDUP"] == "NA" and bad["STATUS"] == "incorrect_numerical"
    out = kopt(ws, "revert", "best")
    assert out[0].startswith("[iter 3] attempt") and out[1].startswith("[revert] solution from iter 1")
    assert (ws / KERNEL).read_text() == first

    s = json.loads("\n".join(kopt(ws, "status", "--json", "--no-record")))
    assert [(it["iteration"], it["outcome"]) for it in s["recent"]] == [
        (1, "improved"), (2, "not judged"), (3, "not judged")]
    assert s["best"]["iteration"] == 1 and not s["stagnating"]
    text = "\n".join(kopt(ws, "status", "--no-record"))
    assert "best by the improvement rule" in text.splitlines()[0] and "(iteration 1," in text.splitlines()[0], text
    assert [e for e in re.findall(r"^## Iteration (\d+)", (ws / "ITERATIONS.md").read_text(), re.M)] == ["1", "2",
                                                                                                        "3"]


#: Paths the docs may name without the workspace holding them: made by kopt as it runs.
MADE_LATER = ("results/calibration-", "results/tilelang/tuning.csv", "results/<", "trajectory/N", "old/")


def test_the_initialized_workspace_cites_only_what_it_holds(tmp_path, git_env):
    """SKILL.md and the workflow prompts of a fresh workspace name no file, script or folder it lacks."""
    from typer.testing import CliRunner

    from kopt.cli.main import app

    ws = tmp_path / "fresh"
    assert CliRunner().invoke(app, ["init", str(ws)]).exit_code == 0
    docs = [ws / "SKILL.md", *sorted((ws / "workflows" / "prompts").glob("*.md"))]
    cited = set()
    for doc in docs:
        text = doc.read_text()
        assert "scripts/" not in text, f"{doc.name} cites a script the workspace does not have"
        cited |= set(re.findall(r"`((?:[\w.-]+/)+[\w.-]*\.(?:md|py|yaml|csv|jsonl|sh))`", text))
    missing = sorted(c for c in cited if not c.startswith(MADE_LATER) and not (ws / c).exists())
    assert cited and not missing, missing
