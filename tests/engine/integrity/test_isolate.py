"""Evaluation children (kopt.eval.child.Child): started before their jobs, replaced after a crash, and
never left running when the parent sends no jobs or dies. Real children on the CPU, tiny cases."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kopt.cases import Case
from kopt.eval import bench
from kopt.eval.bench import BenchOptions
from kopt.eval.child import Child, run_jobs
from kopt.eval.jobs import Job
from kopt.records import Status

ADV = Path(__file__).resolve().parents[2] / "adversarial"
TINY = Case(id=1, batch=2, seqlen_k=9, kv_heads=2, gqa=2, kind="edge")


def _job(name: str, tmp_path: Path) -> Job:
    return Job(candidate_path=str(ADV / f"{name}.py"), case=TINY, device="cpu", seeds_correct=[1],
               seeds_timing=[1, 2], do_timing=False, quick=True, out_dir=str(tmp_path / name))


def _alive(pid: int) -> bool:
    """A live evaluation child (a reaped one has no /proc entry, a zombie an empty command line)."""
    try:
        return b"kopt.eval.worker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def test_prestarted_child_evaluates_a_job(tmp_path):
    child = Child()
    [oc] = run_jobs([_job("honest", tmp_path)], 120.0, child=child)
    assert oc.failure() is None and oc.result.status == Status.ok, oc.stderr_tail
    assert [o.kind for o in oc.result.outputs] == ["correct"]
    # ended once its last result was written (exited, or killed instead of waited for), its log removed
    assert oc.wall_s > 0 and child.popen.returncode in (0, -9) and not child.dir.exists()
    # the start-up it reports: from the parent's start of it to its warm-up's end, then its wait
    assert 0 < oc.result.overhead_s["child_warm"] < oc.wall_s and oc.result.overhead_s["child_wait"] >= 0


@pytest.mark.parametrize("warm", [("tilelang",), ()])
def test_child_warm_hint_imports_tilelang_before_the_candidate(tmp_path, warm):
    # a candidate that fails to import unless tilelang is already loaded: only the hinted child has it
    cand = tmp_path / "needs_warm.py"
    (tmp_path / "_ref.py").write_text((ADV / "_ref.py").read_text())
    cand.write_text((ADV / "honest.py").read_text() + "\nimport sys\nassert 'tilelang' in sys.modules, 'cold'\n")
    job = _job("honest", tmp_path).model_copy(update={"candidate_path": str(cand)})
    [oc] = run_jobs([job], 120.0, child=Child(warm=warm))
    if warm:
        assert oc.failure() is None and oc.result.status == Status.ok, oc.stderr_tail
    else:
        assert oc.result.status == Status.compile_error and "cold" in oc.result.message


def test_cuda_warm_hint_without_a_driver_still_evaluates(tmp_path):
    """The "cuda" hint starts the context thread (start_context) before the imports; on a host without a
    CUDA driver it finds none and ends, and the child goes on to evaluate its job on the CPU."""
    [oc] = run_jobs([_job("honest", tmp_path)], 120.0, child=Child(warm=("cuda",)))
    assert oc.failure() is None and oc.result.status == Status.ok, oc.stderr_tail


def test_context_thread_ends_without_a_driver(monkeypatch):
    """start_context on a host whose libcuda cannot be loaded: a thread that ends on its own, no error."""
    import ctypes

    from kopt.eval import worker

    def no_driver(name, *a, **k):
        raise OSError(f"{name}: cannot open shared object file")

    import threading

    raised = []
    monkeypatch.setattr(ctypes, "CDLL", no_driver)
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    t = worker.start_context()
    t.join(timeout=10)
    assert not t.is_alive() and t.daemon and raised == []


def test_warm_hints_follow_the_device_and_the_candidate_sources(tmp_path):
    torch_only = ADV / "honest.py"
    assert bench.warm_hints(torch_only, "cpu") == ()
    assert bench.warm_hints(torch_only, "auto") == ("cuda",)
    tl = tmp_path / "tl.py"
    (tmp_path / "helper.py").write_text("import tilelang\n")
    tl.write_text("import helper\n")  # named by a sibling module it imports
    assert bench.warm_hints(tl, "cuda") == ("cuda", "tilelang")
    assert bench.warm_hints(tmp_path / "missing.py", "cpu") == ()


def test_job_killing_the_prestarted_child_leaves_the_next_to_a_fresh_one(tmp_path):
    crash, ok = run_jobs([_job("segfault", tmp_path), _job("honest", tmp_path)], 120.0, child=Child())
    assert crash.failure()[0] == Status.crash and crash.returncode == -signal.SIGSEGV
    assert ok.failure() is None and ok.returncode in (0, -9)  # another process, ended after its result


@pytest.mark.parametrize("abort", ["static_violation", "interrupt"])
def test_evaluate_ends_the_child_it_never_sends_jobs(monkeypatch, abort):
    started = []

    class Recorded(Child):
        def __init__(self, **kw):
            super().__init__(**kw)
            started.append(self)

    def interrupted(device):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "Child", Recorded)
    opts = BenchOptions(device="cpu", quick=True, record=False, timing=False)
    if abort == "static_violation":
        assert bench.evaluate(ADV / "patch_timer.py", [TINY], opts)[0].status == Status.static_violation
    else:
        monkeypatch.setattr(bench, "resolve_device", interrupted)
        with pytest.raises(KeyboardInterrupt):
            bench.evaluate(ADV / "honest.py", [TINY], opts)
    [child] = started
    assert child.popen.returncode == -signal.SIGKILL and not child.dir.exists()


def test_child_exits_when_its_parent_dies_before_sending_jobs(tmp_path):
    """SIGKILL runs no cleanup; the closed pipe still ends the waiting child."""
    code = "import os\nfrom kopt.eval.child import Child\nprint(Child().popen.pid, flush=True)\nos._exit(0)\n"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3] / "src"), "TMPDIR": str(tmp_path)}
    pid = int(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                             check=True).stdout)
    deadline = time.time() + 60
    while _alive(pid) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), "the child outlived its parent"


def _python_words(code: str) -> list[str]:
    """What `python -c code` prints, split into words: a fresh interpreter with this kopt first on its path
    and an empty stdin (the worker reads end of file instead of jobs and exits after its warm-up)."""
    src = str(Path(__file__).resolve().parents[3] / "src")
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": src}, input="",
                          capture_output=True, text=True, check=True, timeout=300).stdout.split()


def test_the_child_imports_without_cyclic_gc_and_turns_it_back_on():
    """`python -m kopt.eval.worker` starts with collection off; after its warm-up it freezes what the imports
    made and turns collection on again, before any job (candidate code) runs. A process that only imports the
    module's helpers (kopt.tune.worker) keeps its collection as it was."""
    out = _python_words("import gc, runpy, sys\n"
                        "import kopt.eval.worker\n"
                        "print(gc.isenabled())\n"
                        "try:\n"
                        "    runpy.run_module('kopt.eval.worker', run_name='__main__', alter_sys=True)\n"
                        "except SystemExit:\n"
                        "    pass\n"
                        "print(gc.isenabled(), gc.get_freeze_count() > 0)\n")
    assert out == ["True", "True", "True"], out


def test_the_child_runs_its_warm_up_with_collection_off():
    """Inside its warm-up (the torch and tilelang imports) the child collects no cyclic garbage."""
    out = _python_words("import gc, runpy, sys, types\n"
                        "probe = types.ModuleType('probe')\n"
                        "probe.seen = None\n"
                        "sys.modules['probe'] = probe\n"
                        "src = open(__import__('kopt.eval.worker', fromlist=['x']).__file__).read()\n"
                        "head = 'def _warm() -> None:\\n'\n"
                        "src = src.replace(head, head + '    import probe, gc; probe.seen = gc.isenabled()\\n', 1)\n"
                        "g = {'__name__': '__main__'}\n"
                        "try:\n"
                        "    exec(compile(src, 'worker', 'exec'), g)\n"
                        "except SystemExit:\n"
                        "    pass\n"
                        "print(probe.seen, gc.isenabled())\n")
    assert out == ["False", "True"], out
