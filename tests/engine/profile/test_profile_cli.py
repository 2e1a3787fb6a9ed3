"""`kopt profile` end to end on the CPU (torch.profiler fallback), and its one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from kopt.cli.main import app
from kopt.profile.models import ProfileSummary

REPO = Path(__file__).resolve().parents[3]
SHIPPED = REPO / "solution" / "tilelang" / "run_kernel.py"
HONEST = REPO / "tests" / "candidates" / "torch_honest.py"
runner = CliRunner()


def test_profile_torch_cpu_end_to_end(workspace):
    cand = SHIPPED if SHIPPED.is_file() else HONEST
    r = runner.invoke(app, ["profile", "--case", "1", "--tool", "torch", "--device", "cpu",
                            "--candidate", str(cand), "--calls", "2", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)                          # exactly one JSON object on stdout
    s = ProfileSummary.model_validate(d)
    assert s.tool.value == "torch" and s.case == 1 and s.device == "cpu"
    out = workspace / s.out_dir
    assert out.parent == workspace / "results" / s.backend / "profiling" / "case1"
    for f in ("summary.json", "summary.md", "trace.json", "target.log"):
        assert (out / f).is_file() and f in s.files
    assert (out / "trace.json").stat().st_size < 200_000
    assert ProfileSummary.model_validate_json((out / "summary.json").read_text()).candidate_id == s.candidate_id
    dims = {x.key: x for x in s.diagnosis.dimensions}
    assert list(dims) == ["occupancy", "tail", "stalls", "tensor", "timeline", "memory"]
    for key in ("occupancy", "tail", "stalls", "tensor"):
        assert dims[key].score.value == "NA" and dims[key].reason      # NA always says why
    assert s.timeline["calls"] and len(s.timeline["calls"]) == 2
    if cand == SHIPPED:  # the C kernel is no torch op: the gaps between torch ops are the kernel, not launches
        assert dims["timeline"].score.value == "NA" and "not launches" in dims["timeline"].reason
        assert dims["memory"].score.value == "NA" and "run `kopt bench`" not in dims["memory"].reason
    else:                # a torch candidate's ops are its work
        assert dims["timeline"].score.value != "NA"
    md = (out / "summary.md").read_text()
    assert "## Diagnosis" in md and "SM timeline" in md


def test_profile_errors_are_one_line(workspace):
    r = runner.invoke(app, ["profile", "--case", "1", "--tool", "ncu", "--device", "cpu", "--candidate", str(HONEST)])
    assert r.exit_code == 2 and "ncu needs a CUDA device" in r.stderr  # nothing ran: a usage error
    r = runner.invoke(app, ["profile", "--case", "99", "--device", "cpu", "--candidate", str(HONEST)])
    assert r.exit_code == 2 and "unknown case id 99" in r.stderr
    r = runner.invoke(app, ["profile", "--case", "1", "--device", "cpu", "--candidate", "missing.py"])
    assert r.exit_code == 2 and "candidate file not found" in r.stderr
    r = runner.invoke(app, ["profile", "--case", "1", "--tool", "nsys", "--device", "cpu", "--candidate", str(HONEST)])
    assert r.exit_code == 2 and "--tool must be one of" in r.stderr
    r = runner.invoke(app, ["profile", "--case", "1", "--source", "--device", "cpu", "--candidate", str(HONEST)])
    assert r.exit_code == 2 and "--source samples warp stalls per SASS instruction with ncu" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not list(workspace.glob("results/*/profiling"))      # nothing created


def test_profile_config_reaches_the_candidate_and_the_summary(workspace, tmp_path):
    """--config is passed as run(config=...) to the profiled call (a candidate that fails on it shows it ran)
    and written into summary.json and summary.md; a config that is not a JSON object is a usage error."""
    cand = tmp_path / "cfg.py"
    cand.write_text("BACKEND = 'torch'\nimport torch\n"
                    "def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None, config=None):\n"
                    "    if (config or {}).get('boom'):\n        raise RuntimeError('config boom reached the call')\n"
                    "    return torch.zeros_like(q)\n")
    r = runner.invoke(app, ["profile", "--case", "1", "--tool", "torch", "--device", "cpu", "--candidate", str(cand),
                            "--calls", "1", "--config", '{"boom": 1}'])
    assert r.exit_code == 1 and "config boom reached the call" in r.stderr
    r = runner.invoke(app, ["profile", "--case", "1", "--tool", "torch", "--device", "cpu", "--candidate", str(cand),
                            "--calls", "1", "--config", '{"block_N": 64}', "--json"])
    assert r.exit_code == 0, r.output
    s = ProfileSummary.model_validate_json(r.stdout)
    assert s.config == {"block_N": 64}
    assert '- config: {"block_N": 64}' in (workspace / s.out_dir / "summary.md").read_text()
    r = runner.invoke(app, ["profile", "--case", "1", "--device", "cpu", "--candidate", str(cand), "--config", "[1]"])
    assert r.exit_code == 2 and "--config must be a JSON object" in r.stderr


def test_profile_reports_a_failing_candidate(workspace, tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("BACKEND = 'torch'\ndef run(q, k_cache, v_cache, cache_seqlens, block_table=None, "
                   "softmax_scale=None):\n    raise RuntimeError('boom')\n")
    r = runner.invoke(app, ["profile", "--case", "1", "--tool", "torch", "--device", "cpu", "--candidate", str(bad)])
    assert r.exit_code == 1 and "the profiled target failed" in r.stderr and "boom" in r.stderr


def test_summary_commands_name_no_host_path(tmp_path):
    """Command lines in a profile summary are written relative to the workspace."""
    from kopt.profile.runner import _rel_arg

    ws = tmp_path / "host-root"
    ws.mkdir()
    assert _rel_arg(f"{ws.resolve()}/solution/tilelang/run_kernel.py", ws) == "solution/tilelang/run_kernel.py"
    assert _rel_arg(f"--export={ws.resolve()}/results/x/report", ws) == "--export=results/x/report"
    assert _rel_arg("/usr/local/cuda/bin/ncu", ws) == "/usr/local/cuda/bin/ncu"
    # a whole command: the tool and the interpreter by their names, no host path left
    import sys

    from kopt.profile.runner import _rel_cmd

    got = _rel_cmd(["/usr/local/cuda/bin/ncu", "--export", f"{ws.resolve()}/results/r", sys.executable, "-m",
                    "kopt.profile.target"], ws)
    assert got == ["ncu", "--export", "results/r", Path(sys.executable).name, "-m", "kopt.profile.target"]


def test_profile_runs_a_held_out_draw(workspace, tmp_path, monkeypatch):
    """--case 100N --heldout-seed S profiles draw N of the verdict's held-out draw of S (cut to CPU size as the CPU
    verdict cuts it): the child gets that draw's heads and lengths, the summary names its shape. A held-out id with
    no seed, an id past the draw, or --heldout alone is a usage error that creates nothing."""
    from kopt import workloads

    seen = tmp_path / "seen.json"
    cand = tmp_path / "shape.py"
    cand.write_text("BACKEND = 'torch'\nimport json, os, torch\n"
                    "def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):\n"
                    "    s = {'q': list(q.shape), 'lens': cache_seqlens.tolist(), 'paged': block_table is not None}\n"
                    "    json.dump(s, open(os.environ['SEEN'], 'w'))\n    return torch.zeros_like(q)\n")
    monkeypatch.setenv("SEEN", str(seen))
    want = workloads.draw(workloads.load(), 5, 7, cpu=True)[2]       # case 1003 of a 5-draw of seed 7
    r = runner.invoke(app, ["profile", "--case", "1003", "--heldout", "5", "--heldout-seed", "7", "--tool", "torch",
                            "--device", "cpu", "--candidate", str(cand), "--calls", "1", "--json"])
    assert r.exit_code == 0, r.output
    s = ProfileSummary.model_validate_json(r.stdout)
    assert s.case == 1003 and s.shape == want.shape_dict() and s.variant == want.variant.label()
    got = json.loads(seen.read_text())
    assert got["lens"] == want.lengths and got["q"][0] == want.batch and got["q"][-2] == want.q_heads
    assert got["paged"] == bool(want.variant.page_size)
    before = sorted(p.name for p in (workspace / "results").rglob("*"))
    for args, msg in ((["--case", "1003"], "is a held-out draw: give the verdict's --heldout-seed"),
                      (["--case", "1006", "--heldout", "5", "--heldout-seed", "7"], "held-out ids are 1001-1005"),
                      (["--case", "3", "--heldout", "5"], "--heldout goes with --heldout-seed")):
        r = runner.invoke(app, ["profile", *args, "--device", "cpu", "--candidate", str(cand)])
        assert r.exit_code == 2 and msg in r.stderr, (args, r.output)
    assert sorted(p.name for p in (workspace / "results").rglob("*")) == before
