"""One grammar: every line kopt prints for agents on stdout (bench, verify, tune, peers, calibrate, a stopped run)
is KEY:VALUE fields matched by one regex, CORRECT is always a bool, SPEEDUP is NA when CORRECT is False, NOISY
flags a speedup its rounds disagree on; a closed pipe and a folder outside any workspace end quietly and plainly."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from kopt.cli.main import app
from kopt.records import ANY_LINE, CaseResult, Status, TimingStats, machine_line

#: The grammar, written out here independently of kopt's own constant.
GRAMMAR = re.compile(r"^(\w+:\S+)( \w+:\S+)*$")
REPO = Path(__file__).resolve().parents[3]
ADV = Path(__file__).resolve().parents[2] / "adversarial"
SRC = REPO / "src"

#: A torch candidate with two configs that run one plan (plan_info says so): `kopt tune` on the CPU has nothing to
#: search and must say so.
ONE_PLAN = '''"""Honest torch attention whose configs all run one plan."""
from _ref import attention

BACKEND = "torch"


def configs(case):
    return [{"tile": 32}, {"tile": 64}]


def plan_info(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None, config=None):
    return {"path": "torch"}


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None, config=None):
    return attention(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale)
'''


def fields(line: str) -> dict[str, str]:
    return dict(f.split(":", 1) for f in line.split())


def check(lines: list[str]) -> list[dict[str, str]]:
    """Every line matches the grammar; CORRECT is a bool and SPEEDUP NA when it is False."""
    out = []
    for line in lines:
        assert GRAMMAR.match(line) and ANY_LINE.match(line), line
        f = fields(line)
        if "CORRECT" in f:
            assert f["CORRECT"] in ("True", "False"), line
            if f["CORRECT"] == "False":
                assert f.get("SPEEDUP", "NA") == "NA", line
        out.append(f)
    return out


@pytest.fixture
def small_ws(workspace, tmp_path):
    """Two tiny cases, a one-row matrix, one hidden shape; an honest torch candidate and a one-plan one."""
    cf = yaml.safe_load((REPO / "bench" / "cases.yaml").read_text())
    cf["cases"] = [c for c in cf["cases"] if c["id"] in (1, 2)]
    cf["verify"] = {"seeds": 1, "matrix": [{"cases": [1], "dtype": "bf16", "seqlens": "ragged"}], "hidden": 1,
                    "heldout": 1}
    (workspace / "bench" / "cases.yaml").write_text(yaml.safe_dump(cf))
    for name in ("honest.py", "_ref.py"):
        shutil.copy(ADV / name, workspace / name)
    (workspace / "one_plan.py").write_text(ONE_PLAN)
    return workspace


def kopt(*args: str, code: int = 0):
    res = CliRunner().invoke(app, [str(a) for a in args])
    got = getattr(res.exception, "exit_code", res.exit_code) if res.exception else res.exit_code
    assert got == code, (res.stdout, res.stderr, repr(res.exception))
    return res


def test_every_command_speaks_one_grammar(small_ws):
    ws = small_ws
    bench = check(kopt("bench", "--case", "1,2", "--device", "cpu", "--machine", "--quick", "--candidate",
                       ws / "honest.py").stdout.splitlines())
    assert [f["CASE"] for f in bench] == ["1", "2"]
    out = kopt("verify", ws / "honest.py", "--case", "1,2", "--device", "cpu", "--quick", "--machine",
               "--heldout", "1").stdout.splitlines()
    rows, verdict = check(out[:-1]), check(out[-1:])[0]
    assert len(rows) == 5 and verdict["VERDICT"] == "screen" and verdict["CORRECT"] == "True"
    assert verdict["ROWS_CORRECT"] == "5/5"
    tune = check(kopt("tune", "--case", "1", "--device", "cpu", "--candidate", ws / "one_plan.py", "--no-write",
                      "--no-record").stdout.splitlines())
    assert tune[0]["TUNE"] == "not_applicable" and "one_plan" in tune[0]["MESSAGE"]
    assert tune[1]["TUNE_SUMMARY"] == "ok" and tune[1]["NOT_APPLICABLE"] == "1"
    peers = check(kopt("peers", "--case", "1", "--device", "cpu", "--peers", "torch", "--machine", "--quick",
                       "--no-record", "--candidate", ws / "honest.py").stdout.splitlines())
    assert peers[0]["CASE"] == "1"
    cal = check(kopt("calibrate", "--case", "1", "--device", "cpu", "--quick", "--candidate",
                     ws / "honest.py").stdout.splitlines())
    assert [f.get("AA") for f in cal[:-1]] == ["aa_base", "aa_cand"] and cal[-1]["CALIBRATION"] == "cpu"


def test_a_stopped_run_and_a_tune_line_speak_it_too():
    from kopt.cases import Case
    from kopt.cli.output import stopped_line
    from kopt.tune.api import CaseTune
    from kopt.tune.models import ConfigResult, ShardResult

    check([stopped_line(3, [4, 5, 6], 180.0, 181.2)])
    t = TimingStats(method="host", median_ms=2.0, q1_ms=1.9, q3_ms=2.1, min_ms=1.8, n=10, rel_iqr=0.1)
    win = ConfigResult(index=1, config={"block_N": 64, "mode": "a b:c", "xs": [1, 2]}, correct=True, cold=t)
    ct = CaseTune(case=Case(id=5, batch=16, seqlen_k=141, kv_heads=4, gqa=8, kind="perf"), shards=[ShardResult(
        device_name="NVIDIA H200", n_configs=2)], configs=[win], winner=win, default=win, gain=1.0)
    f = check([ct.line()])[0]
    assert f["TUNE"] == "ok" and f["CORRECT"] == "True" and f["CONFIGS_CORRECT"] == "1"
    assert f["CONFIG"] == "block_N=64,mode=a_b_c,xs=[1;2]" and f["DEVICE"] == "NVIDIA_H200"


def test_a_wrong_output_has_no_speedup_and_disagreeing_rounds_are_noisy():
    from kopt.eval import noise
    from kopt.timing import stats

    wrong = CaseResult(row_id="r", case=5, compiled=True, correct=False, status=Status.incorrect_shape,
                       runtime_ms=0.4, ref_runtime_ms=2.0, speedup=5.1011, speedup_ci=(5.0, 5.2))
    f = check([machine_line(wrong)])[0]
    assert f["SPEEDUP"] == "NA" and f["SPEEDUP_CI"] == "NA" and f["RUNTIME"] == "0.4000"
    # planted: four rounds where the reference was slowed 10x (load on the host), two where it was not
    a = [[1.0] * 5] * 6
    b = [[10.0] * 5] * 4 + [[1.1] * 5] * 2
    ps = stats.paired_speedup(a, b)
    pooled = float(sorted(x for r in b for x in r)[15])      # the pooled median of the reference's 30 samples
    assert noise.row_noisy(ps.speedup, ps.ci, 1.0, pooled) is True
    steady = stats.paired_speedup(a, [[2.0, 2.01, 1.99, 2.0, 2.0]] * 6)
    assert noise.row_noisy(steady.speedup, steady.ci, 1.0, 2.0) is False
    # a ratio of pooled medians outside a tight CI: the rounds and the whole run disagree
    assert noise.row_noisy(19.0, (18.9, 19.1), 0.3981, 0.8388) is True
    row = CaseResult(row_id="r", case=10, compiled=True, correct=True, runtime_ms=0.3981, ref_runtime_ms=0.8388,
                     speedup=19.0126, speedup_ci=(18.9, 19.1), noisy=True)
    assert check([machine_line(row)])[0]["NOISY"] == "1"


def _kopt_proc(args: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    env = dict(env, PYTHONPATH=os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "kopt", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def test_outside_a_workspace_every_command_says_so_with_exit_2(tmp_path, monkeypatch):
    monkeypatch.delenv("KOPT_WORKSPACE")
    monkeypatch.chdir(tmp_path)
    for args in (["status"], ["candidates"], ["log", "--title", "t"], ["commit", "-m", "x"], ["revert", "best"],
                 ["bench", "--case", "1"], ["verify"], ["tune", "--case", "1"], ["calibrate"], ["report"]):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2, (args, res.stdout)
        assert "not in a kopt workspace" in res.stderr and "kopt init" in res.stderr, args
    assert CliRunner().invoke(app, ["cases"]).exit_code == 0      # the packaged case list needs none


def test_a_closed_pipe_ends_quietly(workspace, tmp_path):
    """`kopt status | head -1`, as an agent pipes it: the reader leaves early; kopt exits 0 or 141, nothing on
    stderr. A long table makes sure the pipe is closed while kopt still writes."""
    env = dict(os.environ)
    p1 = subprocess.Popen([sys.executable, "-m", "kopt", "cases"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env=dict(env, PYTHONPATH=str(SRC), COLUMNS="40"), cwd=tmp_path)
    p1.stdout.readline()
    p1.stdout.close()                                        # the reader is gone
    _, err = p1.communicate(timeout=120)
    assert p1.returncode in (0, 141) and err == b"", err
    res = _kopt_proc(["status", "--no-record"], workspace, env)
    assert res.returncode == 0 and "\niterations: " in res.stdout and err == b""
