"""`kopt lab campaign`: a small step file run for real (a step that fails, one past its limit, one skipped for its
`needs`, and the steps after them still run), the log per step, the archive `kopt import` reads, the budget, the
step selection, the dry run, and the shipped workflows/campaign-h200.yaml checked against kopt's own commands."""

from __future__ import annotations

import tarfile

import pytest
from test_lab import ROW, refused

from conftest import REPO, assert_clean, run_main

SMALL = """\
schema_version: 1
steps:
  - name: cases
    run: kopt cases --json --case 10
    timeout_s: 120
  - name: fails
    run: python -c "import sys; print('the reason', file=sys.stderr); sys.exit(3)"
  - name: slow
    run: python -c "import time; time.sleep(60)"
    timeout_s: 1
  - name: after
    run: kopt cases --case 1
    needs: [fails]
  - name: last
    run: python -c "print('still ran')"
"""


@pytest.fixture
def small(workspace):
    (workspace / "candidates.jsonl").write_text(ROW + "\n")
    (workspace / "results").mkdir()
    (workspace / "results" / "note.md").write_text("a record\n")
    f = workspace / "small.yaml"
    f.write_text(SMALL)
    return f


def test_every_step_runs_and_each_failure_is_a_line_with_its_log(small, workspace):
    out = workspace / "out"
    code, stdout, err = run_main(["lab", "campaign", str(small), "--out", str(out)])
    assert code == 1, err  # not every step succeeded
    steps = (out / "logs" / "steps.txt").read_text().splitlines()
    assert [s.split(":")[0].split()[:2] for s in steps] == [["cases", "ok"], ["fails", "failed"], ["slow", "timeout"],
                                              ["after", "skipped"], ["last", "ok"]]
    assert "rc=3" in steps[1] and "logs/fails.err" in steps[1]
    assert steps[3].endswith("needs fails, which was failed")
    assert '"id": 10' in (out / "logs" / "cases.out").read_text()
    reason = (out / "logs" / "fails.err").read_text().split("\n")
    assert reason[0] == "the reason" and "kopt lab campaign: fails exited with 3" in reason
    assert "ended after its limit of 1 s" in (out / "logs" / "slow.err").read_text()
    assert (out / "logs" / "last.out").read_text().strip() == "still ran"
    assert stdout.splitlines()[:5] == steps
    assert stdout.splitlines()[-1].startswith("campaign: 2/5 steps ok; not ok: fails (failed rc=3), slow (timeout")
    with tarfile.open(out / "campaign.tgz") as t:
        names = t.getnames()
    assert "logs/steps.txt" in names and "logs/campaign.json" in names and "results/note.md" in names
    assert [n for n in names if n.endswith("candidates.jsonl")] == ["logs/candidates.jsonl"]


def test_kopt_import_reads_the_campaign_archive(small, workspace, tmp_path, monkeypatch):
    out = workspace / "out"
    assert run_main(["lab", "campaign", str(small), "--out", str(out), "--steps", "last"])[0] == 0
    other = tmp_path / "other"
    (other / "bench").mkdir(parents=True)
    (other / "bench" / "cases.yaml").write_text((workspace / "bench" / "cases.yaml").read_text())
    monkeypatch.setenv("KOPT_WORKSPACE", str(other))
    code, stdout, err = run_main(["import", str(out / "campaign.tgz")])
    assert code == 0 and "appended 1 row(s)" in stdout, err
    assert (other / "candidates.jsonl").read_text().strip() == ROW


def test_budget_steps_and_pack_only(small, workspace):
    """Past the budget a step is skipped and says so; --steps runs the named steps in the file's order; --pack-only
    leaves the archive and steps.txt alone in --out; a second run into the same --out is refused."""
    out = workspace / "out"
    code, stdout, err = run_main(["lab", "campaign", str(small), "--out", str(out), "--steps", "last,cases",
                                  "--budget", "5", "--pack-only"])
    assert code == 1, err
    assert sorted(p.name for p in out.iterdir()) == ["campaign.tgz", "steps.txt"]
    lines = (out / "steps.txt").read_text().splitlines()
    assert [x.split(" s left")[0].rstrip("012345") for x in lines] == ["cases skipped: past the budget (",
                                                                      "last skipped: past the budget ("], lines
    refused(["lab", "campaign", str(small), "--out", str(out)], "already holds a campaign's logs")
    refused(["lab", "campaign", str(small), "--steps", "cases,nope"], "unknown step nope; the file's steps: cases")


@pytest.mark.parametrize("text,needle", [
    ("steps: []\n", "invalid at steps"),
    ("steps:\n  - {name: a, run: bash -c ls}\n", "a step runs `kopt ...` or `python ...`"),
    ("steps:\n  - {name: a, run: kopt status, needs: [b]}\n", "needs 'b', which is no earlier step"),
    ("steps:\n  - {name: a, run: kopt status}\n  - {name: a, run: kopt status}\n", "used twice"),
    ("steps:\n  - {name: a, run: kopt status, timeout_s: 0}\n", "steps.0.timeout_s"),
    ("steps:\n  - {name: a, run: kopt status, env: {X: 1}}\n", "steps.0.env"),
    ("steps:\n  - {name: a, run: kopt bench --nope}\n", "step a: No such option: --nope"),
    ("steps:\n  - {name: a, run: kopt bench --case}\n", "step a: Option '--case' requires an argument"),
    ("steps:\n  - {name: a, run: kopt lab nope}\n", "step a: no such command: kopt lab nope"),
    ("steps:\n  - {name: a, run: kopt lab}\n", "step a: `kopt lab` needs a command"),
    ("steps: [\n", "not valid YAML at line 2, column 1: expected the node content"),
    # an unquoted ': ' inside a command (a hypothesis' words): where, and what the parser found
    ("steps:\n  - name: a\n    run: kopt verify --hypothesis x: y\n",
     "not valid YAML at line 3, column 36: mapping values are not allowed here"),
])
def test_a_bad_step_file_is_refused_before_anything_runs(workspace, text, needle):
    f = workspace / "bad.yaml"
    f.write_text(text)
    refused(["lab", "campaign", str(f), "--out", str(workspace / "out")], needle)
    assert not (workspace / "out").exists()


def test_the_h200_campaign_parses_and_its_dry_run_prints_each_command():
    """The shipped campaign: every kopt step's arguments parse by kopt's own commands (a GPU host runs it without a
    chance to debug first), and the dry run lists each step with its command and limit, running nothing."""
    f = REPO / "workflows" / "campaign-h200.yaml"
    code, out, err = run_main(["lab", "campaign", str(f), "--dry-run"])
    assert_clean(code, out, err, allowed=(0,))
    names = [line.split(":")[0] for line in out.splitlines()]
    for want in ("doctor", "prewarm", "bench", "bf16", "paged256", "calibrate", "verify", "peers", "e2e", "gputests",
                 "report"):
        assert want in names, names
    assert "bench: kopt bench --all --cold-cache --machine  [timeout 420 s]" in out.splitlines()
    assert "report: kopt report  [timeout 180 s; needs bench]" in out.splitlines()


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "workflows").glob("campaign-*.yaml")))
def test_every_shipped_campaign_parses(name):
    """Every campaign in workflows/: each kopt step's arguments parse by kopt's own commands (the dry run), so a GPU
    host that has minutes for it never spends them on a typo."""
    code, out, err = run_main(["lab", "campaign", str(REPO / "workflows" / name), "--dry-run"])
    assert_clean(code, out, err, allowed=(0,))
    assert out.splitlines() and all(":" in line and "[timeout" in line for line in out.splitlines()), out
