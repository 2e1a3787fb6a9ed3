"""Shared fixtures: kopt state in tmp_path; the gpu marker is skipped without CUDA; nvcc builds cached for the run."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "solution" / "tilelang" / "run_kernel.py"
CANDIDATES = Path(__file__).resolve().parent / "candidates"


def combine_rows_needed(cu, tiles: list[int], hkv: int, target: int, G: int, cap: int | None = None) -> list[int]:
    """The rows (indices) of a batch of `tiles` tiles a row that a balanced plan's combine kernel merges, as the kernel
    (tl_decode_cuda, module `cu`) decides on the device: w = max(ceil(sum(tiles) x hkv / target), BAL_MIN_TILES)
    tiles a split, a row's splits round(tiles / w) in 1..cap (no cap: a cap only takes splits away), and a row goes to
    the combine kernel with more than LAST_CTA_MAX_ROWS partial rows (splits x G)."""
    w = max(-(-sum(tiles) * hkv // target), cu.BAL_MIN_TILES)
    splits = [max((2 * t + w) // (2 * w), 1) for t in tiles]
    return [i for i, n in enumerate(splits) if min(n, cap or n) * G > cu.LAST_CTA_MAX_ROWS]


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


# ---- shared by test modules of several stage folders (import them from conftest) ----------------------

#: A torch candidate with three configs (the last crashes when its %s is True): tune and the Ray executor run it.
TUNE_CANDIDATE = '''
import os
import torch

BACKEND = "torch"
PLAN_VERSION = 3  # written into the tuning row
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
            kc, vc = (k_cache[i], v_cache[i]) if block_table is None else (
                k_cache[block_table[i].long()].flatten(0, 1), v_cache[block_table[i].long()].flatten(0, 1))
            k = kc[:n].float().repeat_interleave(hq // hkv, dim=1)
            v = vc[:n].float().repeat_interleave(hq // hkv, dim=1)
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


def assert_reported_as_recorded(c: dict) -> dict:
    """A tuned case's report agrees with its own records, whichever correct config its timings made the winner: the
    winner is a correct config it tried; GAIN is that config's paired speedup inside its CI (1.0, no CI, when the
    default is kept; the screened ratio when no pair ran), DEFAULT and BEST the medians the gain came from; the
    line, the JSON and the table row say the same. Returns the winner's record."""
    f = dict(x.split(":", 1) for x in c["line"].split())
    (w,) = [x for x in c["configs"] if x["config"] == c["config"]]
    assert w["correct"] and w["status"] == "ok" and c["ok"] and f["CORRECT"] == "True"
    if w["index"] == 0:                                                    # the default kept
        assert c["gain"] == 1.0 and c["gain_ci"] is None and f["GAIN_CI"] == "NA"
    elif w["paired_speedup"] is not None:                                  # a finalist that passed its pairs
        lo, hi = c["gain_ci"]
        assert c["gain"] == w["paired_speedup"] and [lo, hi] == w["paired_ci"] and lo <= c["gain"] <= hi
        assert (c["default_ms"], c["best_ms"]) == (w["paired_b"]["median_ms"], w["paired_a"]["median_ms"])
        assert f["GAIN_CI"] == f"{lo:.4f}-{hi:.4f}"
    else:                                                                  # the unpaired rule on screened medians
        (d,) = [x for x in c["configs"] if x["index"] == 0]
        assert c["gain"] == pytest.approx(d["cold"]["median_ms"] / w["cold"]["median_ms"]) and c["gain_ci"] is None
    assert f["GAIN"] == f"{c['gain']:.4f}x" and float(f["DEFAULT"]) > 0 and float(f["BEST"]) > 0
    paired = [x for x in c["configs"] if x["index"] and x["correct"] and x["paired_speedup"] and x["paired_ci"]]
    if paired:  # the best paired finalist, kept or not, with its own figures
        b = max(paired, key=lambda x: (x["paired_speedup"], -x["index"]))
        assert f["FINALIST_GAIN"] == f"{b['paired_speedup']:.4f}x"
        assert f["FINALIST_CI"] == f"{b['paired_ci'][0]:.4f}-{b['paired_ci'][1]:.4f}"
    else:
        assert (f["FINALIST"], f["FINALIST_GAIN"], f["FINALIST_CI"]) == ("NA", "NA", "NA")
    if c["row"] is not None:
        row = c["row"]
        assert row["config"] == c["config"] and row["gain"] == c["gain"]
        assert (row["runtime_ms"], row["default_runtime_ms"]) == (c["best_ms"], c["default_ms"])
        assert [row["gain_lo"], row["gain_hi"]] == (c["gain_ci"] or [None, None])
    return w
