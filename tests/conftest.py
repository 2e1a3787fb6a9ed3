"""Shared fixtures: kopt state in tmp_path; the gpu marker is skipped without CUDA."""

from __future__ import annotations

import contextlib
import io
import shutil
import sys
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


# ---- shared by test modules of several stage folders (import them from conftest) ----------------------

#: A torch candidate with three configs (the last crashes when its %s is True): tune and the Ray executor run it.
TUNE_CANDIDATE = '''
import os
import torch

BACKEND = "torch"
torch.set_num_threads(1)  # small calls on a busy CI box: intra-op threads only add scheduling stalls


def configs(case):
    return [{"passes": 6}, {"passes": 1}, {"passes": 1, "crash": %s}]


def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None, config=None):
    cfg = config or {"passes": 6}
    if cfg.get("crash"):
        os._exit(3)
    b, _, hq, d = q.shape
    hkv = k_cache.shape[2]
    scale = softmax_scale or d ** -0.5
    for _ in range(int(cfg["passes"])):
        out = torch.empty_like(q)
        for i in range(b):
            n = int(cache_seqlens[i])
            k = k_cache[i, :n].float().repeat_interleave(hq // hkv, dim=1)
            v = v_cache[i, :n].float().repeat_interleave(hq // hkv, dim=1)
            s = torch.einsum("hd,nhd->hn", q[i, 0].float(), k) * scale
            out[i, 0] = torch.einsum("hn,nhd->hd", torch.softmax(s, -1), v).to(q.dtype)
    return out
'''


def run_main(argv: list[str]) -> tuple[int, str, str]:
    """`kopt <argv>` through kopt.cli.main.main in-process: (exit code, stdout, stderr)."""
    from kopt.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    old = sys.argv
    sys.argv = ["kopt", *argv]
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = old
    return code, out.getvalue(), err.getvalue()


def _errors(stderr: str) -> list[str]:
    """stderr lines, without the registry's warnings about command modules not written yet."""
    return [x for x in stderr.splitlines() if x.strip() and "command module" not in x]


def assert_clean(code: int, out: str, err: str, allowed=(0, 1, 2)) -> None:
    """No traceback, a known exit code, and a usage error is one `kopt: error:` line, the last on stderr
    (a progress line such as `evaluating 1 case(s)...` may come before it)."""
    assert "Traceback" not in out + err, err
    assert code in allowed, (code, err)
    if code == 2:
        lines = _errors(err)
        errors = [x for x in lines if x.startswith("kopt: error: ")]
        assert len(errors) == 1 and lines[-1] == errors[0], err


def peer_entry(name, ms, sp, na=None, correct=True):
    if na:
        return {"peer": name, "ref": name, "na": na}
    t = {"method": "cupti", "median_ms": ms / sp, "noisy": False}
    return {"peer": name, "ref": f"{name}-1.0", "correct": correct, "message": "" if correct else "max abs err 1",
            "timing": t, "ref_timing": {**t, "median_ms": ms}, "speedup": sp, "speedup_ci": [sp * 0.99, sp * 1.01]}


def peer_rows():
    """Peer panel rows of three cases (a wrong fa3, an NA fa3), shared by the panel and one-truth tests."""
    base = {"mode": "peers", "kind": "case", "run_id": "run1", "device": "H200", "candidate_id": "abc",
            "timestamp": "2026-12-01T00:00:00", "commit": "c0ffee", "status": "ok"}
    return [
        {**base, "case": 1, "variant": "bf16-d128-contig-full", "runtime_ms": 0.01,
         "peers": [peer_entry("fa2", 0.02, 2.0), peer_entry("fa3", 0.03, 3.0), peer_entry("torch", 0.1, 10.0)]},
        {**base, "case": 7, "variant": "bf16-d128-contig-full", "runtime_ms": 0.1,
         "peers": [peer_entry("fa2", 0.189, 1.89), peer_entry("fa2-paged", 0.127, 1.27),
                   peer_entry("fa3", 0.05, 0.5, correct=False)]},
        {**base, "case": 15, "variant": "bf16-d128-contig-full", "runtime_ms": 0.1,
         "peers": [peer_entry("fa2", 0.2, 2.0), peer_entry("fa3", 0.0, 0.0, na="fp16 compiled out")]},
    ]
