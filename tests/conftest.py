"""Shared fixtures: kopt state in tmp_path; the gpu marker is skipped without CUDA."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "solution" / "tilelang" / "run_kernel.py"
CANDIDATES = Path(__file__).resolve().parent / "candidates"


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def _shard(config, items) -> None:
    """KOPT_TEST_SHARD=i/n keeps every n-th collected test from the i-th (0-based): n pytest processes, one
    per shard, run a long GPU test file side by side (their kernels compile in parallel)."""
    import os

    spec = os.environ.get("KOPT_TEST_SHARD")
    if not spec:
        return
    try:
        i, n = (int(x) for x in spec.split("/"))
        assert 0 <= i < n
    except (ValueError, AssertionError):
        raise pytest.UsageError(f"KOPT_TEST_SHARD={spec!r}: want i/n with 0 <= i < n") from None
    keep = set(range(i, len(items), n))
    config.hook.pytest_deselected(items=[it for j, it in enumerate(items) if j not in keep])
    items[:] = [it for j, it in enumerate(items) if j in keep]


def pytest_collection_modifyitems(config, items):
    _shard(config, items)
    if _cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def workspace(tmp_path, monkeypatch) -> Path:
    """A throwaway workspace with the real case file; KOPT_WORKSPACE points at it."""
    ws = tmp_path / "ws"
    (ws / "bench").mkdir(parents=True)
    shutil.copy(REPO / "bench" / "cases.yaml", ws / "bench" / "cases.yaml")
    monkeypatch.setenv("KOPT_WORKSPACE", str(ws))
    return ws


@pytest.fixture
def git_env(tmp_path, monkeypatch):
    """Real git, isolated from the user's config, with a fixed identity."""
    (tmp_path / "gitconfig").write_text("")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for who in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{who}_NAME", "kopt test")
        monkeypatch.setenv(f"GIT_{who}_EMAIL", "kopt@example.invalid")


def kopt(*args: str):
    """CliRunner result of `kopt ARGS`."""
    from typer.testing import CliRunner

    from kopt.cli.main import app

    return CliRunner().invoke(app, [str(a) for a in args])


def failure(res) -> tuple[int, str]:
    """(exit code, stderr) of a failed CliRunner run, whether or not main guards the command."""
    from kopt.errors import KoptError

    if isinstance(res.exception, KoptError):  # unguarded: the domain error escaped to CliRunner
        return res.exception.exit_code, f"kopt: error: {res.exception}\n"
    return res.exit_code, res.stderr
