"""`kopt init DIR`: the scaffolded workspace, its first commit, refusals."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kopt.cli.main import app
from kopt.errors import KoptError
from kopt.paths import TEMPLATES
from kopt.workspace import journal

REPO = Path(__file__).resolve().parents[1]
EXPECTED = ["README.md", "SKILL.md", "HINTS.md", "ITERATIONS.md", "candidates.jsonl", "bench/cases.yaml",
            "solution/tilelang/run_kernel.py", "solution/cuda/README.md", "knowledge/README.md",
            "workflows/prompts/optimize.md", "results/.gitkeep", "scripts/.gitkeep", "trajectory/.gitkeep",
            ".gitignore"]


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
    templates = {p.relative_to(TEMPLATES).as_posix() for p in TEMPLATES.rglob("*")
                 if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}
    generated = {"ITERATIONS.md", "candidates.jsonl", ".gitignore", "results/.gitkeep", "scripts/.gitkeep",
                 "trajectory/.gitkeep"}
    assert set(repo.git.ls_files().splitlines()) == templates | generated >= set(EXPECTED)
    assert (ws / "knowledge" / "profiling" / "diagnosis_checklist.md").is_file(), "the stagnation protocol needs it"
    assert repo.git.status("--porcelain") == ""
    assert (ws / "candidates.jsonl").read_text() == ""
    assert journal.parse((ws / "ITERATIONS.md").read_text()) == []
    assert (ws / "ITERATIONS.md").read_text() == journal.render([])
    assert (ws / "bench" / "cases.yaml").read_text() == (REPO / "bench" / "cases.yaml").read_text()
    assert "BACKEND" in (ws / "solution" / "tilelang" / "run_kernel.py").read_text()
    assert "*.lock" in (ws / ".gitignore").read_text()


def test_packaged_cases_are_the_projects(monkeypatch, tmp_path):
    from kopt.cases import load_cases
    from kopt.paths import cases_file

    assert (TEMPLATES / "bench" / "cases.yaml").read_text() == (REPO / "bench" / "cases.yaml").read_text()
    (tmp_path / "nothing").mkdir()  # a workspace without a case file (a missing folder is a usage error)
    monkeypatch.setenv("KOPT_WORKSPACE", str(tmp_path / "nothing"))
    assert cases_file() == TEMPLATES / "bench" / "cases.yaml"
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


def test_templates_match_the_project():
    """kopt init ships the project's own workspace files; on drift run kopt.workspace.scaffold.sync_templates."""
    from kopt.workspace.scaffold import synced_sources

    tpl = TEMPLATES / "solution" / "tilelang"
    names = sorted(p.name for p in tpl.glob("*.py"))
    assert "run_kernel.py" in names
    for name in names:  # every sibling the starter loads is shipped with it
        for dep in re.findall(r'_load_sibling\("(\w+)"\)', (tpl / name).read_text()):
            assert f"{dep}.py" in names, f"template misses {dep}.py"
    if not (REPO / "solution" / "tilelang" / "run_kernel.py").is_file():
        pytest.skip("not a project checkout")
    sources = synced_sources(REPO)
    drift = [rel for rel, src in sources.items()
             if not (TEMPLATES / rel).is_file() or (TEMPLATES / rel).read_bytes() != src.read_bytes()]
    drift += [f"solution/tilelang/{n}" for n in names if f"solution/tilelang/{n}" not in sources]
    assert not drift, ("templates out of date: PYTHONPATH=src python3 -c "
                       "'import kopt.workspace.scaffold as s; s.sync_templates(\".\")'  -> " + ", ".join(drift))


def test_sync_templates_names_only_what_it_changed(tmp_path, monkeypatch):
    """The maintainer's sync copies the project's files over the templates and says which it changed: a second
    sync changes nothing, and a starter file the project no longer has is removed and named."""
    import shutil

    import kopt.paths
    from kopt.workspace.scaffold import sync_templates, synced_sources

    if not (REPO / "solution" / "tilelang" / "run_kernel.py").is_file():
        pytest.skip("not a project checkout")
    tpl = tmp_path / "templates"
    shutil.copytree(TEMPLATES, tpl)
    monkeypatch.setattr(kopt.paths, "TEMPLATES", tpl)
    sync_templates(REPO)
    assert sync_templates(REPO) == []
    (tpl / "solution" / "tilelang" / "gone.py").write_text("x = 1\n")
    (tpl / "knowledge" / "patterns.md").write_text("stale\n")
    assert sorted(sync_templates(REPO)) == ["knowledge/patterns.md", "solution/tilelang/gone.py"]
    assert not (tpl / "solution" / "tilelang" / "gone.py").exists()
    assert all((tpl / rel).read_bytes() == src.read_bytes() for rel, src in synced_sources(REPO).items())
