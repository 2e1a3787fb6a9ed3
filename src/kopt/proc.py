"""The one child-process layer: spawn in a session of its own, wait with a deadline, kill the group, reap.

Every child kopt starts (evaluation and tuning children, profilers and their targets) runs in its own
session, so killing its process group also ends whatever it started (a candidate's helpers, a profiled
target): a bounded run leaves no orphan on the GPU. Children started with `spawn` are tracked until
they are reaped; `reaping()` kills the ones still alive when the block ends early (SIGTERM, Ctrl-C,
an error).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

#: The folder holding the kopt package: first on a child's PYTHONPATH, so `python -m kopt...` in the child
#: runs this checkout even where kopt is not installed.
SRC_DIR = Path(__file__).resolve().parents[1]

_LIVE: set[subprocess.Popen] = set()


def child_env() -> dict[str, str]:
    """The environment of every kopt child: this kopt first on PYTHONPATH (once, no empty entry), unbuffered output,
    kopt's bytecode cache (kopt.bytecode)."""
    from kopt import bytecode

    env = bytecode.child_env(dict(os.environ))  # its bytecode cached where the environment writes none
    parts = [str(SRC_DIR)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(SRC_DIR)]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def python_module(module: str, *args: str) -> list[str]:
    """argv of `python -m module args...` with this interpreter."""
    return [sys.executable, "-m", module, *args]


def spawn(argv: list[str], log: Path, stdin=subprocess.DEVNULL, env: Optional[dict] = None,
          err_log: Optional[Path] = None, cwd: Optional[Path] = None) -> subprocess.Popen:
    """Start argv in a session of its own, stdout and stderr into `log` (truncated), or stderr into `err_log` when
    given; tracked until reaped. OSError when it cannot start."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as fh, open(err_log or os.devnull, "wb") as eh:
        p = subprocess.Popen(argv, stdin=stdin, stdout=fh, stderr=eh if err_log else subprocess.STDOUT, cwd=cwd,
                             env=env if env is not None else child_env(), start_new_session=True)
    _LIVE.add(p)
    return p


def kill_group(p: subprocess.Popen) -> None:
    """SIGKILL a child's whole process group (its own session: what it started goes too); no reaping."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        p.kill()


def kill(p: subprocess.Popen) -> Optional[int]:
    """Kill the child's group unless it has exited, then reap it; its return code."""
    if p.poll() is None:
        kill_group(p)
    rc = p.wait()
    _LIVE.discard(p)
    return rc


def stop(p: subprocess.Popen, grace_s: float = 15.0) -> Optional[int]:
    """End a child that may hold children of its own sessions (a kopt command's evaluation children): SIGTERM to its
    group first, so a kopt child unwinds and ends its own; its group killed after `grace_s`; reaped. Its return code."""
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            p.terminate()
        try:
            p.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    kill_group(p)  # what is left of its group (its own helpers), whether or not it has exited
    rc = p.wait()
    _LIVE.discard(p)
    return rc


def wait(p: subprocess.Popen, deadline: float, grace_s: Optional[float] = None) -> tuple[Optional[int], bool]:
    """(return code, timed out): wait until the perf_counter `deadline`; past it the group is killed and reaped
    (with `grace_s`, ended by `stop`: SIGTERM first)."""
    try:
        rc = p.wait(timeout=max(0.1, deadline - time.perf_counter()))
    except subprocess.TimeoutExpired:
        return (kill(p) if grace_s is None else stop(p, grace_s)), True
    _LIVE.discard(p)
    return rc, False


@contextmanager
def reaping():
    """Kill the children this process spawned and still holds when the block ends early: SIGTERM, Ctrl-C, errors.

    SIGTERM is turned into SystemExit while the block runs (main thread only), so `finally` blocks run."""
    import threading

    old = None
    if threading.current_thread() is threading.main_thread():
        def stop(signum, frame):
            raise SystemExit(128 + signum)
        old = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        for p in list(_LIVE):
            kill(p)
        if old is not None:
            signal.signal(signal.SIGTERM, old)


@dataclass
class Finished:
    """A finished child: exit status and its combined output (also written to the log file)."""

    rc: int
    output: str
    timed_out: bool = False


def run_logged(cmd: list[str], log: Path, timeout_s: float, cwd: Optional[Path] = None,
               env: Optional[dict] = None) -> Finished:
    """Run a command with a wall-clock limit in a session of its own; stdout+stderr are appended to `log`
    and returned. On timeout (rc 124) or Ctrl-C the command's whole group is killed. OSError when it cannot start."""
    log.parent.mkdir(parents=True, exist_ok=True)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                         cwd=cwd, env=env or child_env(), start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout_s)
        rc, to = p.returncode, False
    except subprocess.TimeoutExpired:
        kill_group(p)
        out, _ = p.communicate()
        rc, to = 124, True
    except BaseException:                    # Ctrl-C: take the child group down with us
        kill_group(p)
        raise
    out = out or ""
    with open(log, "a") as fh:
        fh.write("$ " + " ".join(cmd) + "\n" + out + f"\n[exit {rc}{' (timeout)' if to else ''}]\n")
    return Finished(rc, out, to)
