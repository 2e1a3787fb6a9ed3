"""Kept evaluation children (kopt.eval.warm): a run leaves a started child for the next run of the same
environment, the next takes it (and its start-up costs that run nothing), another environment does not, a
kill and an idle timeout end it. Real supervisors and children on the CPU."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pytest

from kopt import proc
from kopt.cases import Case
from kopt.eval import bench, warm
from kopt.eval.bench import BenchOptions
from kopt.eval.jobs import ENV_WARM
from kopt.records import Status

ADV = Path(__file__).resolve().parents[2] / "adversarial"
TINY = Case(id=1, batch=2, seqlen_k=9, kv_heads=2, gqa=2, kind="edge")
OPTS = BenchOptions(device="cpu", quick=True, record=False, timing=False)


@pytest.fixture
def short_tmp(monkeypatch):
    """A short temporary folder for the sockets (a UNIX socket path holds at most 107 bytes), the
    supervisors' and children's too; every supervisor started under it is stopped afterwards."""
    d = tempfile.mkdtemp(prefix="kw", dir="/tmp")
    monkeypatch.setattr(tempfile, "tempdir", d)
    monkeypatch.setenv("TMPDIR", d)
    yield Path(d)
    for sock in Path(d).glob("kopt-warm-*.sock"):
        import socket

        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            c.connect(str(sock))
            c.sendall(b"stop\n")
            c.recv(64)
        except OSError:
            pass
        finally:
            c.close()
    time.sleep(0.5)
    shutil.rmtree(d, ignore_errors=True)


def _env() -> dict[str, str]:
    env = proc.child_env()
    env[ENV_WARM] = ""
    return env


def _wait_for(pred, timeout=60.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.1)
    return False


def test_the_next_run_takes_the_kept_child(short_tmp, monkeypatch):
    monkeypatch.setenv(warm.ENV_KEEP, "60")
    first = bench.evaluate(ADV / "honest.py", [TINY], OPTS)[0]
    assert first.status == Status.ok and "child_kept" not in first.overhead_s
    assert _wait_for(lambda: warm.socket_path(warm.key(_env())).exists())
    second = bench.evaluate(ADV / "honest.py", [TINY], OPTS)[0]
    assert second.status == Status.ok and second.correct, second.message
    assert second.overhead_s["child_kept"] == 1
    # its start-up (timed from its supervisor's start of it) began before this run
    assert second.overhead_s["child_warm"] > 0 and second.overhead_s["child_wait"] >= 0
    # the supervisor started another child for the run after
    third = bench.evaluate(ADV / "honest.py", [TINY], OPTS)[0]
    assert third.status == Status.ok and third.overhead_s.get("child_kept") == 1


def test_a_run_starts_the_next_runs_supervisor_beside_its_own_child(short_tmp, monkeypatch):
    """The supervisor starts with the run's own child, not after the run: the run right after the first finds a
    child that warmed up meanwhile."""
    monkeypatch.setenv(warm.ENV_KEEP, "60")
    seen = []
    first = bench.evaluate(ADV / "honest.py", [TINY], OPTS,
                           on_result=lambda r: seen.append([s["socket"] for s in warm.supervisors()]))[0]
    assert first.status == Status.ok and "child_kept" not in first.overhead_s
    assert seen == [[str(warm.socket_path(warm.key(_env())))]]  # already running when the run's row was made
    assert _wait_for(lambda: warm.socket_path(warm.key(_env())).exists())
    second = bench.evaluate(ADV / "honest.py", [TINY], OPTS)[0]
    assert second.overhead_s["child_kept"] == 1


def test_another_environment_starts_its_own_child(short_tmp, monkeypatch):
    monkeypatch.setenv(warm.ENV_KEEP, "60")
    bench.evaluate(ADV / "honest.py", [TINY], OPTS)
    assert _wait_for(lambda: warm.socket_path(warm.key(_env())).exists())
    monkeypatch.setenv("KOPT_TUNING_CSV", str(short_tmp / "other.csv"))  # what a candidate reads: another key
    other = bench.evaluate(ADV / "honest.py", [TINY], OPTS)[0]
    assert other.status == Status.ok and "child_kept" not in other.overhead_s


def test_off_by_zero_and_on_the_cpu_by_default(short_tmp, monkeypatch):
    monkeypatch.delenv(warm.ENV_KEEP, raising=False)
    assert warm.keep_seconds("cpu") == 0 and warm.keep_seconds("cuda") == warm.DEFAULT_KEEP_S and warm.enabled()
    bench.evaluate(ADV / "honest.py", [TINY], OPTS)
    assert not list(short_tmp.glob("kopt-warm-*.sock"))  # a CPU run leaves none
    monkeypatch.setenv(warm.ENV_KEEP, "0")
    assert warm.keep_seconds("cuda") == 0 and not warm.enabled()
    monkeypatch.setenv(warm.ENV_KEEP, "soon")
    assert warm.keep_seconds("cuda") == 0 and not warm.enabled()


def test_a_kept_child_killed_reports_its_signal(short_tmp):
    env = _env()
    warm.keep(env, 60)
    assert _wait_for(lambda: warm.socket_path(warm.key(env)).exists())
    # kopt doctor lists it
    assert [k["keep_s"] for k in warm.supervisors() if k["socket"] == str(warm.socket_path(warm.key(env)))] == [60]
    path = warm.socket_path(warm.key(env))
    assert path.stat().st_mode & 0o777 == 0o600 and path.stat().st_uid == os.getuid()
    kept = warm.take(env)
    assert kept is not None and kept.poll() is None and kept.log.exists()
    assert os.getpgid(kept.pid) == kept.pid  # a session of its own, as every kopt child
    kept.kill()
    assert kept.wait(timeout=30) == -signal.SIGKILL


def _supervisors(path: Path) -> list[int]:
    return [k["pid"] for k in warm.supervisors() if k["socket"] == str(path)]


def test_an_idle_supervisor_ends_its_child_and_socket(short_tmp):
    env = _env()
    warm.keep(env, 1.0)
    path = warm.socket_path(warm.key(env))
    assert _wait_for(lambda: path.exists(), timeout=20)
    assert _wait_for(lambda: not path.exists() and not _supervisors(path), timeout=30)
    assert warm.take(env) is None and not warm.stop(env)


def test_a_supervisor_whose_socket_is_removed_exits(short_tmp):
    env = _env()
    warm.keep(env, 600)
    path = warm.socket_path(warm.key(env))
    assert _wait_for(lambda: path.exists(), timeout=20) and _supervisors(path)
    path.unlink()
    assert _wait_for(lambda: not _supervisors(path), timeout=30)


def test_a_kept_child_a_candidate_crashes_or_hangs_is_reported_and_replaced(short_tmp, monkeypatch):
    """The kept child is the run's child in every way: a segfault is a crash with the signal as its return
    code (read from the supervisor), a hang is killed at the job's limit; the supervisor carries on and the
    next run takes a fresh child."""
    monkeypatch.setenv(warm.ENV_KEEP, "60")
    bench.evaluate(ADV / "honest.py", [TINY], OPTS)
    assert _wait_for(lambda: warm.socket_path(warm.key(_env())).exists())
    crash = bench.evaluate(ADV / "segfault.py", [TINY], OPTS)[0]
    assert crash.status == Status.crash and crash.overhead_s["child_kept"] == 1, crash.message
    assert "killed by SIGSEGV" in crash.message
    hang = bench.evaluate(ADV / "infinite_loop.py", [TINY], replace(OPTS, timeout_s=3.0))[0]
    assert hang.status == Status.timeout and hang.overhead_s.get("child_kept") == 1, hang.message
    ok = bench.evaluate(ADV / "honest.py", [TINY], OPTS)[0]
    assert ok.status == Status.ok and ok.overhead_s["child_kept"] == 1


def test_the_verdict_neither_takes_nor_leaves_a_kept_child(short_tmp, monkeypatch):
    """Every option set of the Verdict's plan turns kept children off, and a run with them off starts its own
    child even where one waits (the Verdict runs only in children its own run started)."""
    from kopt.cases import load_file
    from kopt.eval import verdict

    groups = verdict.plan(load_file(), OPTS)
    assert sum(map(len, groups)) > 20 and all(not o.kept_child for group in groups for _, o in group)
    monkeypatch.setenv(warm.ENV_KEEP, "60")
    bench.evaluate(ADV / "honest.py", [TINY], OPTS)
    assert _wait_for(lambda: warm.socket_path(warm.key(_env())).exists())
    own = bench.evaluate(ADV / "honest.py", [TINY], replace(OPTS, kept_child=False))[0]
    assert own.status == Status.ok and "child_kept" not in own.overhead_s
    assert bench.evaluate(ADV / "honest.py", [TINY], OPTS)[0].overhead_s["child_kept"] == 1  # still there
