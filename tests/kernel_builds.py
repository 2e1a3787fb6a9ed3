"""The kernel builds the tests check (sm_90a: TileLang lowering and nvcc; wave64: lowering for gfx942 and clang), each
made once a run and, where the machine has a second core, ahead of the tests in a background process.

A build costs seconds to tens of seconds of one core (lowering a balanced kernel ~10 s, nvcc ~2 s); test_kernel_cpu
checks about forty and test_wave64 a sweep of 33 plans (~150 s). A test module lists the builds it will ask for
(KERNEL_BUILDS: (kind, keywords) pairs). When any test of such a module that uses its `builds` fixture is selected,
conftest starts one `python tests/kernel_builds.py FOLDER` with the session, which makes them, module by module in
the order the modules run and within a module from its last build back, each into FOLDER/<key>.pkl, while the other
test files run on the other core. A test asks through Builds.get: a finished build is read, one the background
process is making is waited for, any other is made in the test's own process (and claimed, so the two never make the
same one; a test asking from the first build and the background from the last meet in the middle). The results are
those of the same calls in the test process (the kernel's own compile_cuda_check, build_cuda_source, lower_kernels,
compile_combine_check, kopt.wave64.check_plans): only where they are made differs. Not a test module: pytest does not
collect it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUN_KERNEL = HERE.parent / "solution" / "tilelang" / "run_kernel.py"
#: How long a test waits for a build the background process has started before making it itself.
WAIT_S = 900


def key(kind: str, kw: dict) -> str:
    """The file name of a build: a hash of its kind and keywords."""
    return hashlib.sha256(json.dumps([kind, kw], sort_keys=True).encode()).hexdigest()[:24]


def load_kernel(name: str = "kopt_tilelang_run_kernel_test"):
    """solution/tilelang/run_kernel.py, loaded by path as the harness loads it."""
    spec = importlib.util.spec_from_file_location(name, RUN_KERNEL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def ptx_barriers(source: str) -> int:
    """bar.sync / barrier.sync instructions in the PTX of a kernel source (nvcc, sm_90a, no GPU)."""
    from tilelang.contrib import nvcc as tl_nvcc

    ptx = tl_nvcc.compile_cuda(source, "ptx", ["-gencode", "arch=compute_90a,code=sm_90a"],
                               options=tl_nvcc.default_compile_options(["-std=c++20", "-w"]))
    text = bytes(ptx).decode()
    return text.count("bar.sync") + text.count("barrier.sync")


def compute(rk, kind: str, kw: dict):
    """One build, in this process: compile (rk.compile_cuda_check), source (rk.build_cuda_source), lowered (the main
    kernel lowered for sm_90a, no nvcc), combine (the standalone combine kernel compiled), barriers (the PTX barrier
    count of a compile's main kernel), wave64 (kopt.wave64.check_plans of a candidate on a device profile)."""
    if kind == "compile":
        return rk.compile_cuda_check(**kw)
    if kind == "source":
        return rk.build_cuda_source(**kw)
    if kind == "lowered":
        return sys.modules["tl_decode_cuda"].lower_kernels("sm_90a", **kw)["main"]  # run_kernel.py's own import
    if kind == "combine":
        return sys.modules["tl_decode_cuda"].compile_combine_check(**kw)
    if kind == "barriers":
        return ptx_barriers(rk.compile_cuda_check(**kw)["main"]["source"])
    if kind == "wave64":
        from kopt import hardware, wave64

        items = [(case, config) for case, config in kw["items"]]
        return wave64.check_plans(kw["candidate"], items, hardware.profile(kw["profile"]).model_dump(),
                                  workers=kw["workers"], compile_it=kw["compile"])
    raise ValueError(f"unknown build kind {kind!r}")


def _claim(folder: Path, k: str) -> bool:
    """Take build k for this process; False when another process has it."""
    try:
        os.close(os.open(folder / f"{k}.claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def _store(folder: Path, k: str, value) -> None:
    tmp = folder / f"{k}.{os.getpid()}.tmp"
    tmp.write_bytes(pickle.dumps(value))
    os.replace(tmp, folder / f"{k}.pkl")


class Builds:
    """The builds of a run, for one test module: get(kind, **kw) returns the build, made once. rk: the kernel module
    the sm_90a kinds call (None where only wave64 builds are asked for)."""

    def __init__(self, rk, folder: Path | None = None, child: subprocess.Popen | None = None):
        self.rk, self.folder, self.child = rk, folder, child
        self.memo: dict[str, object] = {}

    def _running(self) -> bool:
        return self.child is not None and self.child.poll() is None

    def get(self, kind: str, **kw):
        k = key(kind, kw)
        if k in self.memo:
            return self.memo[k]
        f, deadline = self.folder, time.monotonic() + WAIT_S
        while True:
            if f is None:
                value = compute(self.rk, kind, kw)
            elif (f / f"{k}.pkl").exists():
                value = pickle.loads((f / f"{k}.pkl").read_bytes())
            elif _claim(f, k) or not self._running() or time.monotonic() > deadline:
                value = compute(self.rk, kind, kw)      # not made there (or it stopped): made here
                _store(f, k, value)
            else:                                       # the background process is making it
                time.sleep(0.1)
                continue
            break
        self.memo[k] = value
        return value


def start(folder: Path, builds: list[tuple[str, dict]]) -> subprocess.Popen:
    """The background process that makes `builds`, in this order, into folder."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "plan.json").write_text(json.dumps(builds))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(HERE.parent / "src"), str(HERE),
                                                                  os.environ.get("PYTHONPATH")) if p))
    with open(folder / "background.log", "wb") as log:
        return subprocess.Popen([sys.executable, str(Path(__file__)), str(folder)], env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _background(folder: Path) -> None:
    """Make every build of folder/plan.json not yet claimed; a build that fails is released for the test to make
    (and fail on) itself."""
    from tilelang.contrib import nvcc

    from conftest import NvccCache

    nvcc.compile_cuda = NvccCache(nvcc.compile_cuda, nvcc.logger, nvcc.get_nvcc_compiler())
    parent = os.getppid()
    rk = load_kernel()
    for kind, kw in json.loads((folder / "plan.json").read_text()):
        k = key(kind, kw)
        if os.getppid() != parent:   # the test run is gone (killed before it could stop this process)
            return
        if (folder / f"{k}.pkl").exists() or not _claim(folder, k):
            continue
        try:
            _store(folder, k, compute(rk, kind, kw))
        except Exception as e:  # the test makes it again in its own process and reports the failure there
            print(f"{kind} {kw}: {type(e).__name__}: {e}", flush=True)
            (folder / f"{k}.claim").unlink(missing_ok=True)


if __name__ == "__main__":
    _background(Path(sys.argv[1]))
