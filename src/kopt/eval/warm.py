"""A started evaluation child kept for the next kopt run: the start-up (interpreter, `import torch`, the CUDA
context, `import tilelang`: 2-3 s of a `kopt bench` on an H200 host with kopt's bytecode cache, 5-7 s without)
is paid between runs instead of in them.

A run that finds no kept child starts its own and, right after it, a small supervisor (`python -m
kopt.eval.warm SOCKET KEEP_S`, no torch) that at once starts one evaluation child beside the run's (`python
-m kopt.eval.worker`: it warms up as every child does and waits for its jobs; no candidate code runs before
them) and offers it on a UNIX socket named by a key of everything the child's start depends on: the
interpreter, the working folder, the child's environment and what it warms, and kopt's own sources (their
paths, sizes and times). The next run of the same key takes the child: it sends the jobs path through the
socket, the supervisor passes it to the child's stdin and, when the child exits, sends its return code back.
The supervisor starts the next child as soon as the taken one has its jobs (it warms up while that run goes
on: a run right after finds it ready or nearly, as the run right after the first finds the child that warmed
up beside the first run's own), and exits after KEEP_S seconds without a taker.

One child still serves one run (the isolation of a fresh process per evaluation batch is the same); a run
that finds no child of its key (the first, one with another environment, a busy or gone supervisor) starts
its own as before. The Verdict takes none and leaves none (BenchOptions.kept_child): it runs only in children
its own run started. Only a socket of this user is taken from; the supervisor's is 0600.
$KOPT_KEEP_WARM_S sets KEEP_S (0: off); by default 300 s for runs on a CUDA device, off on
the CPU (a kept child holds a CUDA context and the memory of torch).
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from kopt import proc
from kopt.eval.jobs import ENV_T0

ENV_KEEP = "KOPT_KEEP_WARM_S"
#: Seconds a supervisor keeps its child without a taker, for runs on a CUDA device (CPU runs: off).
DEFAULT_KEEP_S = 300.0
#: How long a run waits for a supervisor's answer before it starts its own child.
ANSWER_S = 0.5


def _setting() -> Optional[float]:
    """$KOPT_KEEP_WARM_S in seconds: None when unset, 0 when 0, negative or not a number (off)."""
    raw = os.environ.get(ENV_KEEP)
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        return 0.0


def enabled() -> bool:
    """False when $KOPT_KEEP_WARM_S is 0 (or not a number): no run takes or leaves a kept child."""
    v = _setting()
    return v is None or v > 0


def keep_seconds(device: str) -> float:
    """$KOPT_KEEP_WARM_S, else DEFAULT_KEEP_S on a CUDA device and 0 on the CPU; a bad value: 0 (off)."""
    v = _setting()
    if v is None:
        return DEFAULT_KEEP_S if device != "cpu" else 0.0
    return v


def _sources_stamp() -> list:
    root = Path(__file__).resolve().parents[1]
    return sorted((str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*.py"))


def key(env: dict[str, str]) -> str:
    """What a kept child's start depends on, hashed: interpreter, working folder, environment (less the
    start time), kopt's sources."""
    text = json.dumps([sys.executable, os.getcwd(), sorted((k, v) for k, v in env.items() if k != ENV_T0),
                       _sources_stamp()])
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _prefix() -> str:
    return f"kopt-warm-{os.getuid()}-"


def socket_path(k: str) -> Path:
    return Path(tempfile.gettempdir()) / f"{_prefix()}{k}.sock"


class _Pipe:
    """The kept child's stdin, as the run sees it: one line (the jobs path) goes through the socket."""

    def __init__(self, conn: socket.socket):
        self.conn = conn

    def write(self, data: bytes) -> None:
        self.conn.sendall(json.dumps({"jobs": data.decode().strip()}).encode() + b"\n")

    def close(self) -> None:
        pass


class Kept:
    """A kept child handed to this run: the subprocess.Popen surface kopt.proc and kopt.eval.child use
    (pid, stdin, poll, wait, kill); its return code comes from its supervisor, -1 when that is gone."""

    def __init__(self, conn: socket.socket, pid: int, log: Path, started: float):
        self.conn, self.pid, self.log, self.started = conn, pid, log, started
        self.stdin = _Pipe(conn)
        self.returncode: Optional[int] = None
        self._buf = b""

    def _read(self, timeout: Optional[float]) -> None:
        if self.returncode is not None:
            return
        end = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = None if end is None else max(0.0, end - time.monotonic())
            if not select.select([self.conn], [], [], left)[0]:
                return
            chunk = self.conn.recv(4096)
            if not chunk:  # the supervisor is gone: the child's code is unknown
                self.returncode = -1
                return
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        self.returncode = int(json.loads(line).get("rc", -1))
        self.conn.close()

    def poll(self) -> Optional[int]:
        self._read(0)
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        self._read(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired("kopt kept child", timeout)
        return self.returncode

    def kill(self) -> None:
        """SIGKILL its process group (a session of its own, as every kopt child)."""
        for kill in (os.killpg, os.kill):
            try:
                kill(self.pid, signal.SIGKILL)
                return
            except (ProcessLookupError, PermissionError):
                continue


def take(env: dict[str, str]) -> Optional[Kept]:
    """The kept child of this environment's key, or None (no supervisor, a busy or broken one)."""
    if not any(Path(tempfile.gettempdir()).glob(f"{_prefix()}*.sock")):  # none at all: skip hashing kopt's sources
        return None
    path = socket_path(key(env))
    try:
        if path.stat().st_uid != os.getuid():  # only a supervisor of this user hands children over
            return None
    except OSError:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(ANSWER_S)
        conn.connect(str(path))
        conn.sendall(b"take\n")
        buf = b""
        while b"\n" not in buf:
            chunk = conn.recv(4096)
            if not chunk:
                raise OSError("no answer")
            buf += chunk
        got = json.loads(buf.partition(b"\n")[0])
        if not got.get("ok"):
            raise OSError("no child")
        conn.settimeout(None)
        return Kept(conn, int(got["pid"]), Path(got["log"]), float(got["started"]))
    except (OSError, ValueError, KeyError):
        conn.close()
        return None


def stop(env: dict[str, str]) -> bool:
    """End the supervisor of this environment's key and its child; False when none listens."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(5.0)
        conn.connect(str(socket_path(key(env))))
        conn.sendall(b"stop\n")
        conn.recv(64)  # its answer, or end of file as it exits
        return True
    except OSError:
        return False
    finally:
        conn.close()


def supervisors() -> list[dict]:
    """This user's running supervisors: pid, socket, the idle seconds it keeps a child (`kopt doctor`). Ending
    one (`kill PID`) ends its child too (its stdin closes); a stale socket is replaced by the next run."""
    out = []
    for proc_dir in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc_dir / "cmdline").read_bytes().split(b"\0")
            if proc_dir.stat().st_uid != os.getuid() or b"kopt.eval.warm" not in argv:
                continue
            i = argv.index(b"kopt.eval.warm")
            out.append({"pid": int(proc_dir.name), "socket": argv[i + 1].decode(), "keep_s": float(argv[i + 2])})
        except (OSError, ValueError, IndexError):
            continue
    return sorted(out, key=lambda x: x["pid"])


def keep(env: dict[str, str], seconds: float) -> None:
    """Start a supervisor that keeps a child of `env` for the next run (nothing when seconds is 0 or one
    already listens on this key). It outlives this run: started in a session of its own, not tracked."""
    if seconds <= 0:
        return
    path = socket_path(key(env))
    if path.exists():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
            return  # a supervisor is there (busy or idle): it starts the next child itself
        except OSError:
            path.unlink(missing_ok=True)  # a stale socket of a supervisor that died
        finally:
            probe.close()
    log = path.with_suffix(".log")
    with open(log, "wb") as fh:
        # not proc.spawn: that tracks a child to be ended with this run, and the supervisor outlives it
        subprocess.Popen(proc.python_module("kopt.eval.warm", str(path), str(seconds)), stdin=subprocess.DEVNULL,
                         stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def spawn_worker(env: dict[str, str]) -> tuple[subprocess.Popen, Path, float]:
    """The one way an evaluation child starts (a run's own, kopt.eval.child, and a supervisor's): `python -m
    kopt.eval.worker` with env (and its start time, ENV_T0) in a session of its own, its output in child.log
    of a folder of its own; (the process, that log, the start time)."""
    folder = Path(tempfile.mkdtemp(prefix="kopt-eval-"))
    log = folder / "child.log"
    started = time.time()
    p = proc.spawn(proc.python_module("kopt.eval.worker"), log, stdin=subprocess.PIPE,
                   env=dict(env, **{ENV_T0: repr(started)}))
    return p, log, started


def serve(path: Path, seconds: float) -> int:
    """The supervisor: keep one started child, hand it to the next taker, start the next child at once (it
    warms up while the taken one runs, so a run right after this one finds it ready or nearly), report the
    taken child's return code, repeat; exit after `seconds` without a taker, or once its socket file is gone
    (the child is ended, the socket removed)."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        srv.bind(str(path))
    except OSError:  # another supervisor got there first
        return 0
    path.chmod(0o600)  # this user's runs only
    srv.listen(4)
    env = dict(os.environ)
    child = spawn_worker(env)
    try:
        idle_since = time.monotonic()
        srv.settimeout(min(seconds, 2.0))
        while True:
            try:
                conn, _ = srv.accept()
            except TimeoutError:  # idle too long, or its socket removed: end the child, exit
                if time.monotonic() - idle_since >= seconds or not path.exists():
                    return 0
                continue
            got = _hand_over(conn, child, env)
            if got == "stop":
                return 0
            if got is not None:  # taken: the next child, started when this one got its jobs
                child, idle_since = got, time.monotonic()
            elif child[0].poll() is not None:  # it died waiting: start another
                child = spawn_worker(env)
    finally:
        child[0].kill()
        child[0].wait()
        srv.close()
        path.unlink(missing_ok=True)


def _hand_over(conn: socket.socket, child: tuple, env: dict[str, str]):
    """Serve one request: "take" (the next child, started once this one has its jobs, when it went to the
    taker, who gets its return code once it exits; None when it could not go), or "stop" (returned as is)."""
    p, log, started = child
    with conn:
        try:
            conn.settimeout(5.0)
            req = conn.recv(64).strip()
            if req == b"stop":
                conn.sendall(b'{"ok": true}\n')
                return "stop"
            if req != b"take" or p.poll() is not None:
                conn.sendall(b'{"ok": false}\n')
                return None
            conn.sendall(json.dumps({"ok": True, "pid": p.pid, "log": str(log), "started": started}).encode() + b"\n")
            conn.settimeout(None)
            buf = b""
            while b"\n" not in buf and p.poll() is None:  # the jobs line, or the taker gone, or the child killed
                if select.select([conn], [], [], 0.05)[0]:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    buf += chunk
            if b"\n" in buf:
                p.stdin.write((json.loads(buf.partition(b"\n")[0])["jobs"] + "\n").encode())
            p.stdin.close()  # no jobs: the child reads end of file and exits
        except (OSError, ValueError, KeyError):
            p.kill()
        nxt = spawn_worker(env)
        rc = p.wait()
        try:
            conn.sendall(json.dumps({"rc": rc}).encode() + b"\n")
        except OSError:
            pass
        return nxt


if __name__ == "__main__":
    sys.exit(serve(Path(sys.argv[1]), float(sys.argv[2])))
