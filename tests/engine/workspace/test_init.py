"""`kopt init DIR`: the scaffolded workspace, its first commit, refusals; the workspace template is the project's
own files, read where they are in the source tree and carried by a built wheel."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kopt import template
from kopt.cli.main import app
from kopt.errors import KoptError
from kopt.store import journal

REPO = Path(__file__).resolve().parents[3]
EXPECTED = ["README.md", "SKILL.md", "HINTS.md", "ITERATIONS.md", "candidates.jsonl", "bench/cases.yaml",
            "solution/tilelang/run_kernel.py", "solution/cuda/README.md", "knowledge/README.md",
            "workflows/prompts/optimize.md", "results/.gitkeep", "scripts/.gitkeep", "trajectory/.gitkeep",
            ".gitignore"]


GENERATED = {"ITERATIONS.md", "candidates.jsonl", ".gitignore", "results/.gitkeep", "scripts/.gitkeep",
             "trajectory/.gitkeep"}

pytestmark = pytest.mark.usefixtures("git_env")  # real git, isolated (conftest)


def test_init_scaffolds_and_commits(tmp_path):
    import git

    ws = tmp_path / "new" / "ws"
    res = CliRunner().invoke(app, ["init", str(ws)])
    assert res.exit_code == 0, (res.stdout, res.exception)
    for rel in EXPECTED:
        assert (ws / rel).is_file(), rel
    repo = git.Repo(ws)
    assert [c.summary for c in repo.iter_commits()] == ["kopt init"]
    assert set(repo.git.ls_files().splitlines()) == set(template.files()) | GENERATED >= set(EXPECTED)
    assert (ws / "knowledge" / "profiling" / "diagnosis_checklist.md").is_file(), "the stagnation protocol needs it"
    assert repo.git.status("--porcelain") == ""
    assert (ws / "candidates.jsonl").read_text() == ""
    assert journal.parse((ws / "ITERATIONS.md").read_text()) == []
    assert (ws / "ITERATIONS.md").read_text() == journal.render([])
    assert (ws / "bench" / "cases.yaml").read_text() == (REPO / "bench" / "cases.yaml").read_text()
    assert "BACKEND" in (ws / "solution" / "tilelang" / "run_kernel.py").read_text()
    assert "*.lock" in (ws / ".gitignore").read_text()


def test_a_workspace_without_bench_files_reads_the_projects(monkeypatch, tmp_path):
    """The fallback case matrix and workload library are the shipped ones: in the source tree, the project's own."""
    from kopt.cases import load_cases
    from kopt.paths import cases_file
    from kopt.workloads import workloads_file

    (tmp_path / "nothing").mkdir()  # a workspace without a case file (a missing folder is a usage error)
    monkeypatch.setenv("KOPT_WORKSPACE", str(tmp_path / "nothing"))
    assert cases_file() == REPO / "bench" / "cases.yaml"
    assert workloads_file() == REPO / "bench" / "workloads.yaml"
    assert [c.id for c in load_cases()] == list(range(1, 22))  # the seed's 1-14, ragged 15-18, seed shapes 19-21


def test_init_refuses_non_empty(tmp_path):
    d = tmp_path / "busy"
    d.mkdir()
    (d / "mine.txt").write_text("keep me\n")
    res = CliRunner().invoke(app, ["init", str(d)])
    code, err = (res.exception.exit_code, f"{res.exception}\n") if isinstance(res.exception, KoptError) \
        else (res.exit_code, res.stderr)
    assert code == 2 and err.count("\n") == 1 and "not empty" in err and "--force" in err
    assert sorted(p.name for p in d.iterdir()) == ["mine.txt"]


def test_init_force_keeps_existing_files(tmp_path):
    import git

    d = tmp_path / "busy"
    d.mkdir()
    (d / "README.md").write_text("my readme\n")
    (d / "mine.txt").write_text("keep me\n")
    res = CliRunner().invoke(app, ["init", str(d), "--force"])
    assert res.exit_code == 0, (res.stdout, res.exception)
    assert (d / "README.md").read_text() == "my readme\n" and "1 kept" in res.stdout
    committed = set(git.Repo(d).git.ls_files().splitlines())
    assert "README.md" not in committed and "mine.txt" not in committed and "SKILL.md" in committed


def test_init_refuses_a_file(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    res = CliRunner().invoke(app, ["init", str(f)])
    if isinstance(res.exception, KoptError):  # unguarded registration
        code, err = res.exception.exit_code, str(res.exception)
    else:
        code, err = res.exit_code, res.stderr
    assert code == 2 and "not a folder" in err


def _same_as_shipped(ws: Path) -> None:
    """ws holds each file of the template byte for byte: the project's shipped files and the template-only ones;
    git tracks exactly those and the generated ones."""
    import git

    shipped = template.shipped(REPO)
    only = {p.relative_to(template.TEMPLATES).as_posix(): p for p in template.TEMPLATES.rglob("*") if p.is_file()}
    assert shipped and only
    for rel, src in [*shipped.items(), *only.items()]:
        assert (ws / rel).read_bytes() == src.read_bytes(), rel
    assert set(git.Repo(ws).git.ls_files().splitlines()) == set(shipped) | set(only) | GENERATED


def test_init_writes_the_shipped_files_byte_for_byte(tmp_path):
    ws = tmp_path / "fresh"  # tmp_path / "ws" is the autouse workspace (conftest)
    res = CliRunner().invoke(app, ["init", str(ws)])
    assert res.exit_code == 0, (res.stdout, res.exception)
    assert template.source_root() == REPO and template.root() == REPO
    _same_as_shipped(ws)


def test_the_template_ships_the_starter_with_every_module_it_imports():
    from kopt.candidate import sources

    shipped = template.shipped(REPO)
    starter = [p.relative_to(REPO).as_posix() for p in sources(REPO / "solution" / "tilelang" / "run_kernel.py")]
    assert len(starter) > 1 and set(starter) <= set(shipped), "add the missing modules to kopt.template.SHIPPED"


def test_the_package_templates_hold_no_copy_of_a_project_file():
    """kopt/templates/ keeps only what the project has no copy of: nothing in it is a shipped path, and none equals
    the project's file of the same path."""
    only = [p for p in template.TEMPLATES.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert only, "the workspace README is template-only"
    for p in only:
        rel = p.relative_to(template.TEMPLATES).as_posix()
        assert rel not in template.shipped(REPO), rel
        assert not (REPO / rel).is_file() or (REPO / rel).read_bytes() != p.read_bytes(), rel


def test_an_incomplete_template_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(template, "SHIPPED", (*template.SHIPPED, "knowledge/gone.md"))
    res = CliRunner().invoke(app, ["init", str(tmp_path / "fresh")])
    code, err = (res.exception.exit_code, f"{res.exception}\n") if isinstance(res.exception, KoptError) \
        else (res.exit_code, res.stderr)
    assert code == 1 and err.count("\n") == 1 and "knowledge/gone.md" in err and "template is incomplete" in err
    assert not (tmp_path / "fresh").exists()


def _build_inputs(dst: Path) -> Path:
    """The project as a clean checkout has it, less what a build never reads (git, history, tests, caches)."""
    skip = shutil.ignore_patterns(".*", "__pycache__", "*.egg-info", "build", "dist", "trajectory", "results",
                                  "tests", "candidates.archive")
    shutil.copytree(REPO, dst, ignore=skip)
    return dst


def test_a_built_wheel_carries_the_template_and_init_from_it_writes_the_shipped_files(tmp_path):
    """sdist from a copy of the project, wheel from the unpacked sdist (so the sdist carries what the wheel needs),
    the wheel unzipped onto PYTHONPATH: `python -m kopt init` reads its templates from the package, and the
    workspace it writes equals the project's shipped files."""
    src = _build_inputs(tmp_path / "project")
    run = dict(check=True, capture_output=True, text=True)
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path / "sdist")], cwd=src, **run)
    (sdist,) = (tmp_path / "sdist").glob("kopt-*.tar.gz")
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path / "unpacked", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    (unpacked,) = (tmp_path / "unpacked").iterdir()
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(unpacked), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "wheel")], **run)
    (wheel,) = (tmp_path / "wheel").glob("kopt-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        z.extractall(tmp_path / "site")
    assert {f"kopt/templates/{rel}" for rel in template.shipped(REPO)} <= names
    assert "kopt/templates/README.md" in names
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    where = subprocess.run([sys.executable, "-c", "import kopt.template as t; print(t.root())"], env=env, **run)
    assert Path(where.stdout.strip()) == tmp_path / "site" / "kopt" / "templates"
    subprocess.run([sys.executable, "-m", "kopt", "init", str(tmp_path / "fresh")], env=env, cwd=tmp_path, **run)
    _same_as_shipped(tmp_path / "fresh")
