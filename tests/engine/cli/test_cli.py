"""CLI surface: every command registers, has --help, and --help stays light (no torch/tilelang import)."""

import subprocess
import sys
from importlib import import_module

import pytest
from typer.testing import CliRunner

from kopt.cli.main import COMMANDS, app


def test_every_command_module_imports():
    for mod in COMMANDS.values():
        m = import_module(f"kopt.cli.{mod}")
        assert hasattr(m, "command") or hasattr(m, "app"), mod


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_on_every_command(name):
    r = CliRunner().invoke(app, [name, "--help"])
    assert r.exit_code == 0 and "Usage" in r.output


def test_help_is_light():
    code = ("import sys; from kopt.cli.main import app; "
            "bad=[m for m in ('torch','tilelang','git','pandas','matplotlib') if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_cases_table_and_json():
    import json

    r = CliRunner().invoke(app, ["cases", "--json"])
    assert r.exit_code == 0
    rows = json.loads(r.stdout)
    assert len(rows) == 21 and rows[9]["c500_ref_ms"] == 0.062 and rows[9]["q_heads"] == 32
    assert rows[14]["kind"] == "ragged" and rows[14]["lengths"][:2] == [32768, 512]
    r = CliRunner().invoke(app, ["cases", "--case", "12"])
    assert r.exit_code == 0 and "32768" in r.stdout and "0.595" in r.stdout
    r = CliRunner().invoke(app, ["cases", "--case", "99"])
    assert r.exit_code == 2


def test_doctor_json():
    import json

    r = CliRunner().invoke(app, ["doctor", "--json"])
    assert r.exit_code == 0
    d = json.loads(r.stdout)
    assert d["torch"] and "will_run" in d and "profilers" in d


@pytest.mark.parametrize("text", [",", "3-1", "1-999999999", "a", "1,,x"])
def test_parse_ids_rejects_bad_lists(text):
    from kopt.cases import parse_ids
    from kopt.errors import UsageError

    with pytest.raises(UsageError):
        parse_ids(text)


def test_parse_ids_ranges():
    from kopt.cases import parse_ids

    assert parse_ids("1,3,5-7") == [1, 3, 5, 6, 7] and parse_ids(None) is None


def test_edit_text_runs_the_editor(monkeypatch):
    """$EDITOR gets a temp file; what it leaves there comes back."""
    from kopt.cli.common import edit_text

    monkeypatch.setenv("VISUAL", "sed -i s/draft/final/")
    assert edit_text("a draft\n") == "a final\n"
    monkeypatch.setenv("VISUAL", "false")
    assert edit_text("x") is None


def test_doctor_columns_fit_their_labels():
    from kopt.cli.doctor import lines

    d = {"device": {"name": "cpu"}, "python": "3.11", "torch": "2.13", "tilelang": None, "flash_attn": None,
         "nvcc": None, "kopt": "source", "profilers": {"ncu": False}, "will_run": ["a"], "will_not_run": ["b"]}
    import re

    out = [re.sub(r"\[/?[a-z ]+\]", "", ln) for ln in lines(d)]  # rich markup off: what the terminal shows
    assert "flash_attn    not found" in out and "will not run  b" in out
    w = len("will not run  ")                                   # one value column, after the longest label
    assert all(ln[:w].endswith("  ") and ln[w] != " " for ln in out), out


def test_doctor_plan_for_a_device_that_is_not_here():
    """`kopt doctor --plan-for C500 --case N` on the CPU: the plan the kernel would run on a C500, from its profile (104
    units, wave64, 64 KB a unit): no Hopper-only switch, one-row reductions; a config the C500 cannot run is the answer
    (NA and why), not a crash; an unknown device, the host, or no --case are usage errors."""
    import json

    from conftest import SHIPPED

    r = CliRunner().invoke(app, ["doctor", "--plan-for", "C500", "--case", "10", "--json", "--candidate", str(SHIPPED)])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    p = d["plan"]
    assert (p["device"], p["units"], p["warp_size"], p["smem_per_unit"]) == ("C500", 104, 64, 65536)
    assert p["red_batch"] == 1 and not (p["pdl"] or p["red_once"] or p["fast_math"]) and p["smem_bytes"] <= 65536
    assert d["case"]["id"] == 10 and d["wave64"] is None
    r = CliRunner().invoke(app, ["doctor", "--plan-for", "C500", "--case", "12", "--page-size", "16", "--head-dim",
                                 "64", "--candidate", str(SHIPPED)])
    assert r.exit_code == 0 and "warp 64" in r.stdout and "16-token pages" in r.stdout, r.output
    assert "kernels decode_balanced" in r.stdout and "pdl off, red_once off, fast_math off" in r.stdout
    r = CliRunner().invoke(app, ["doctor", "--plan-for", "C500", "--case", "10", "--config", '{"red_batch": 2}',
                                 "--candidate", str(SHIPPED)])
    assert r.exit_code == 0 and "plan" in r.stdout and "NA: unsupported CUDA config red_batch=2 on C500" in r.stdout
    for args, says in ((["--plan-for", "C500"], "needs --case"), (["--plan-for", "cpu", "--case", "1"], "known: H200"),
                       (["--plan-for", "X9", "--case", "1"], "no such GPU profile")):
        r = CliRunner().invoke(app, ["doctor", *args])
        assert r.exit_code == 2 and says in r.output, (args, r.output)


def test_doctor_plan_for_with_wave64():
    """--wave64 lowers the C500 plan for HIP gfx942 and compiles it where Debian's HIP toolchain is found (else NA with
    what is missing); the stubs of the compile are named."""
    pytest.importorskip("tilelang")
    from conftest import SHIPPED
    from kopt import wave64

    r = CliRunner().invoke(app, ["doctor", "--plan-for", "C500", "--case", "1", "--wave64",
                                 "--candidate", str(SHIPPED)])
    assert r.exit_code == 0, r.output
    assert "lowers for HIP gfx942: main" in r.stdout and "MFMA" in r.stdout
    if wave64.find_toolchain()[0] is None:
        assert "compile      NA: no " in r.stdout
    else:
        assert "B code object for gfx942" in r.stdout and "stubbed" in r.stdout and "0 B scratch" in r.stdout


def test_a_patch_over_the_shipped_candidate_is_a_candidate(tmp_path, monkeypatch):
    """`--candidate CHANGE.patch` (a `git diff` of the candidate's folder): the shipped candidate as the working tree
    holds it, with the patch applied to a copy in kopt's cache; the workspace is untouched. Here the patch drops the
    balanced kernel's small-paged rule, so against the shipped kernel its plans differ exactly on the draws the shipped
    kernel plans balanced below BAL_MIN_ALLOC_TILES in pages. A patch that touches another folder, does not apply,
    is not a patch or is missing is one line and exit 2."""
    import json
    import shutil
    import subprocess

    from conftest import SHIPPED

    ws = tmp_path / "ws"
    shutil.copytree(SHIPPED.parent, ws / "solution" / "tilelang", ignore=shutil.ignore_patterns("__pycache__"))
    (ws / "results" / "tilelang").mkdir(parents=True)
    shutil.copy(SHIPPED.parents[2] / "results" / "tilelang" / "tuning.csv", ws / "results" / "tilelang")

    def git(*a):
        return subprocess.run(["git", "-C", str(ws), "-c", "user.email=t@t", "-c", "user.name=t", *a], check=True,
                              capture_output=True, text=True).stdout

    git("init", "-q")
    git("add", "solution", "results")
    git("commit", "-qm", "shipped")
    cuda = ws / "solution" / "tilelang" / "tl_decode_cuda.py"
    shipped_text = cuda.read_text()
    cuda.write_text(shipped_text.replace("\nBAL_MIN_PAGED_TILES = 16\n", "\nBAL_MIN_PAGED_TILES = 1 << 30\n"))
    patch = tmp_path / "no-small-paged.patch"
    patch.write_text(git("diff"))
    git("checkout", "--", ".")
    monkeypatch.setenv("KOPT_WORKSPACE", str(ws))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    shipped = ws / "solution" / "tilelang" / "run_kernel.py"
    args = ["workloads", "--draw", "12", "--seed", "205", "--plan-for", "H200", "--against", str(shipped)]
    r = CliRunner().invoke(app, [*args, "--candidate", str(patch), "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    small_paged = [x["case"] for x in rows if x["against_detail"]["balanced"] and x["max_len"] < 256 * 64
                   and x["against_detail"]["paged"]]
    assert small_paged and [x["case"] for x in rows if x["differs"]] == small_paged
    assert cuda.read_text() == shipped_text and not git("status", "--porcelain", "--", "solution", "results")
    (copy,) = (tmp_path / "cache" / "kopt" / "patched").glob("*/solution/tilelang/tl_decode_cuda.py")
    assert "\nBAL_MIN_PAGED_TILES = 1 << 30\n" in copy.read_text()
    assert (copy.parents[2] / "results" / "tilelang" / "tuning.csv").is_file()
    # the same patch over the same files is exported once
    r = CliRunner().invoke(app, [*args, "--candidate", str(patch)])
    assert r.exit_code == 0 and len(list((tmp_path / "cache" / "kopt" / "patched").iterdir())) == 1, r.output
    # refusals: another folder, a working tree the patch no longer applies to, not a patch, no file
    other = tmp_path / "other.patch"
    other.write_text("--- a/results/tilelang/tuning.csv\n+++ b/results/tilelang/tuning.csv\n@@ -1 +1 @@\n-x\n+y\n")
    cuda.write_text(shipped_text.replace("\nBAL_MIN_PAGED_TILES = 16\n", "\nBAL_MIN_PAGED_TILES = 8\n"))
    junk = tmp_path / "junk.diff"
    junk.write_text("not a diff\n")
    for spec, says in ((other, "changes files of its folder solution/tilelang/ only"), (patch, "does not apply"),
                       (junk, "not a patch git can apply"), (tmp_path / "gone.patch", "no such candidate file")):
        r = CliRunner().invoke(app, [*args, "--candidate", str(spec)])
        assert r.exit_code == 2 and says in " ".join(r.output.split()), (spec, r.output)
    assert len(list((tmp_path / "cache" / "kopt" / "patched").iterdir())) == 1


def test_plan_fields_apart_names_fields_held_apart_and_fields_one_plan_lacks():
    from kopt.doctor import plan_fields_apart

    assert plan_fields_apart({"a": 1, "b": 2}, {"a": 1, "b": 3}) == ["b"]
    # a field one candidate lacks is a switch its kernel does not have: off there, apart only where the other is on
    assert plan_fields_apart({"a": 1, "eager_v": True}, {"a": 1}) == ["eager_v"]
    assert plan_fields_apart({"a": 1, "eager_v": False, "n": 0}, {"a": 1}) == []
    assert plan_fields_apart({"a": 1, "n": 2}, {"a": 1}) == ["n"]
    assert plan_fields_apart({"a": 1}, {"a": 1}) == [] and plan_fields_apart(None, None) == []
    assert plan_fields_apart({"a": 1}, None) == ["plan"]


def test_workloads_plans_a_draw_on_a_device_and_marks_what_a_change_moves(tmp_path, monkeypatch):
    """`kopt workloads --draw N --seed S --plan-for H200 --against OTHER`: each draw's plan as the candidate resolves it
    from the H200's profile (no GPU), the other candidate's beside it, and the draws whose plans differ: here a copy of
    the shipped kernel without the balanced kernel's small-paged rule differs exactly on the draws the shipped kernel
    plans balanced below BAL_MIN_ALLOC_TILES. Misused flags are one line and exit 2."""
    import json
    import shutil

    from conftest import SHIPPED

    other = tmp_path / "solution" / "tilelang"  # beside its own copy of the tuning table, as in a workspace
    shutil.copytree(SHIPPED.parent, other, ignore=shutil.ignore_patterns("__pycache__"))
    table = SHIPPED.parents[2] / "results" / "tilelang" / "tuning.csv"
    (tmp_path / "results" / "tilelang").mkdir(parents=True)
    shutil.copy(table, tmp_path / "results" / "tilelang" / "tuning.csv")
    cuda = other / "tl_decode_cuda.py"
    cuda.write_text(cuda.read_text().replace("\nBAL_MIN_PAGED_TILES = 16\n", "\nBAL_MIN_PAGED_TILES = 1 << 30\n"))
    args = ["workloads", "--draw", "12", "--seed", "205", "--plan-for", "H200", "--candidate", str(SHIPPED)]
    r = CliRunner().invoke(app, [*args, "--against", str(other / "run_kernel.py"), "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    small_paged = [x["case"] for x in rows if x["plan_detail"]["balanced"] and x["max_len"] < 256 * 64
                   and x["plan_detail"]["paged"]]
    assert small_paged and [x["case"] for x in rows if x["differs"]] == small_paged
    assert all(x["against"].startswith(("split_", "direct")) for x in rows if x["differs"])
    # the fields apart: the kernel and what follows from it where the plans differ, none where they do not
    assert all("balanced" in x["fields"].split(",") and "kernels" in x["fields"] for x in rows if x["differs"])
    assert all(x["fields"] == "-" for x in rows if not x["differs"])
    # the same candidate as a commit holds it (REV:PATH): the working copy reverted to the shipped kernel's, the
    # commit's plans still differ on the same draws, and the line names the revision as given
    import subprocess

    def git(*a):
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.email=t@t", "-c", "user.name=t", *a], check=True,
                       capture_output=True)

    git("init", "-q")
    git("add", "solution", "results")
    git("commit", "-qm", "other")
    shutil.copy(SHIPPED.parent / "tl_decode_cuda.py", cuda)
    monkeypatch.setenv("KOPT_WORKSPACE", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    r = CliRunner().invoke(app, [*args, "--against", "HEAD:solution/tilelang/run_kernel.py"])
    assert r.exit_code == 0, r.output
    line = " ".join(r.stdout.split())
    assert f"against HEAD:solution/tilelang/run_kernel.py (cases {','.join(map(str, small_paged))})" in line, line
    r = CliRunner().invoke(app, [*args, "--against", "HEAD~3:solution/tilelang/run_kernel.py"])
    assert r.exit_code == 2 and "is not a commit" in r.output
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0 and "plans on H200" in r.stdout and "balanced <=" in r.stdout, r.output
    for bad, says in ((["workloads", "--plan-for", "H200"], "add --draw N"),
                      (["workloads", "--draw", "2", "--against", str(SHIPPED)], "--plan-for DEVICE"),
                      (["workloads", "--draw", "2", "--plan-for", "X9"], "no such GPU profile"),
                      (["workloads", "--draw", "2", "--plan-for", "H200", "--against", str(tmp_path / "x.py")],
                       "no such candidate file")):
        r = CliRunner().invoke(app, bad)
        assert r.exit_code == 2 and says in r.output, (bad, r.output)


def test_workloads_takes_the_seed_by_the_name_verify_bench_and_profile_give_it():
    """`kopt workloads --draw N --heldout-seed S` is the draw of `--seed S`, and of no other seed."""
    import json

    def cases(*flags):
        r = CliRunner().invoke(app, ["workloads", "--draw", "6", *flags, "--json"])
        assert r.exit_code == 0, r.output
        return [(x["case"], x["model"], x["batch"], x["max_len"]) for x in json.loads(r.stdout)]

    assert cases("--heldout-seed", "20261207") == cases("--seed", "20261207") != cases("--seed", "20261206")
