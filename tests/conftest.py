"""Shared fixtures: kopt state in tmp_path; the gpu marker is skipped without CUDA; nvcc builds cached for the run."""

from __future__ import annotations

import hashlib
import json
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


#: The background builds of this run (tests/kernel_builds.py): {"folder": Path, "process": Popen} once started.
BACKGROUND: dict = {}


def _nvcc_found() -> bool:
    import importlib.util

    return (importlib.util.find_spec("tilelang") is not None
            and (shutil.which("nvcc") is not None or Path("/usr/local/cuda/bin/nvcc").exists()))


def pytest_collection_finish(session):
    """Start one background process for the kernel builds (tests/kernel_builds.py) of the test modules that list
    KERNEL_BUILDS and have a selected test using their `builds` fixture: module by module in the order they run,
    each module's from its last build back; it runs on the second core while the other files' tests run."""
    import importlib.util

    if session.config.option.collectonly or importlib.util.find_spec("tilelang") is None:
        return
    mods = {}
    for it in session.items:
        mod = getattr(it, "module", None)
        if hasattr(mod, "KERNEL_BUILDS") and "builds" in getattr(it, "fixturenames", ()):
            mods.setdefault(mod.__name__, mod)
    plan = [b for mod in mods.values() for b in reversed(mod.KERNEL_BUILDS)
            if b[0] == "wave64" or _nvcc_found()]             # the sm_90a tests skip without nvcc
    if plan:
        import tempfile

        import kernel_builds

        folder = Path(tempfile.mkdtemp(prefix="kopt-kernel-builds-"))
        BACKGROUND.update(folder=folder, process=kernel_builds.start(folder, plan))


def pytest_sessionfinish(session):
    proc = BACKGROUND.get("process")
    if proc is not None:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        shutil.rmtree(BACKGROUND["folder"], ignore_errors=True)
    BACKGROUND.clear()


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


class NvccCache:
    """nvcc builds of one test run, keyed by a hash of the source, the output format, the arch, the flags and the
    compiler: kernel tests build the same source more than once (a variant beside its default, a plan checked
    twice), and each nvcc run of a TileLang kernel costs seconds. Wraps tilelang.contrib.nvcc.compile_cuda; its
    verbose log (ptxas -v: registers, spills) is replayed on a hit, so callers that read it see the same lines."""

    def __init__(self, compile_cuda, logger, compiler: str):
        self.compile_cuda, self.logger, self.compiler = compile_cuda, logger, compiler
        self.builds: dict[str, tuple[bytes, list[str]]] = {}
        self.hits = self.misses = 0

    def key(self, code, target_format, arch, options, verbose) -> str:
        blob = json.dumps([code, target_format, arch, options, bool(verbose), self.compiler])
        return hashlib.sha256(blob.encode()).hexdigest()

    def __call__(self, code, target_format="ptx", arch=None, options=None, path_target=None, verbose=False):
        if path_target is not None or arch is None:   # writes a file, or reads the current target: not cached
            return self.compile_cuda(code, target_format, arch, options, path_target, verbose)
        key = self.key(code, target_format, arch, options, verbose)
        if key in self.builds:
            self.hits += 1
            data, log = self.builds[key]
            for line in log:
                self.logger.info("%s", line)
            return bytearray(data)
        import logging

        log: list[str] = []

        class Grab(logging.Handler):
            def emit(self, record):
                log.append(record.getMessage())

        grab = Grab()
        self.logger.addHandler(grab)
        try:
            data = self.compile_cuda(code, target_format, arch, options, None, verbose)
        finally:
            self.logger.removeHandler(grab)
        self.misses += 1
        if log or not verbose:   # a verbose build whose log nobody enabled is not kept: a later caller may want it
            self.builds[key] = (bytes(data), log)
        return data


@pytest.fixture(scope="session")
def nvcc_cache():
    """One NvccCache for the whole run, installed as tilelang's nvcc entry point while the session lasts."""
    pytest.importorskip("tilelang")
    from tilelang.contrib import nvcc

    try:
        compiler = nvcc.get_nvcc_compiler()
    except Exception:   # no nvcc: the tests that need one skip themselves
        compiler = ""
    cache = NvccCache(nvcc.compile_cuda, nvcc.logger, compiler)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(nvcc, "compile_cuda", cache)
        yield cache


@pytest.fixture
def git_env(tmp_path, monkeypatch):
    """Real git, isolated from the user's config, with a fixed identity."""
    (tmp_path / "gitconfig").write_text("")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for who in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{who}_NAME", "kopt test")
        monkeypatch.setenv(f"GIT_{who}_EMAIL", "kopt@example.invalid")


def _png_1x1() -> bytes:
    """A valid one-pixel PNG."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00\x00")) + chunk(b"IEND", b""))


@pytest.fixture
def no_figures(monkeypatch):
    """kopt commit and kopt report without their matplotlib renders (three figures a commit: most of its time), for
    tests of the loop's ledger, journal, git and trajectory, which read no figure. Each figure is still written under
    its own name (a one-pixel PNG), so a commit stages the same files. The figures themselves are tested in test_plot,
    test_vcs and test_report_browser."""
    from kopt.report import plot
    from kopt.report.campaign import load_campaign

    def make_plots(ws, out=None, campaign=None, device=None):
        c = campaign or load_campaign(ws, device)
        out = Path(out) if out else Path(ws) / "results" / c.backend / "plots"
        out.mkdir(parents=True, exist_ok=True)
        names = ["speedup.png", "roofline.png", "trajectory.png"] + [f"peers-{d}.png" for d in c.peers]
        for name in names:
            (out / name).write_bytes(_png_1x1())
        return [out / n for n in names]

    monkeypatch.setattr(plot, "make_plots", make_plots)


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
