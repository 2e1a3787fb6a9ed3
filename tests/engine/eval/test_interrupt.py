"""Ctrl-C or SIGTERM on `kopt bench` ends its evaluation child too (children run in their own session)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SLEEPY = ("import time\nBACKEND = 'torch'\n"
          "def run(q, k_cache, v_cache, cache_seqlens, block_table=None, softmax_scale=None):\n"
          "    time.sleep(600)\n")


def _workers(parent: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(parent), "-f", "kopt.eval.worker"], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def _alive(pid: int) -> bool:
    """A live evaluation child (a reaped one has no /proc entry, a zombie an empty command line)."""
    try:
        return b"kopt.eval.worker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_ends_the_child(workspace, tmp_path, sig):
    cand = tmp_path / "sleepy.py"
    cand.write_text(SLEEPY)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3] / "src"), "TMPDIR": str(tmp_path)}
    # A terminal's Ctrl-C reaches a process whose SIGINT is at its default; a test run started in the background of
    # a non-interactive shell inherits SIGINT ignored (and Python keeps it so), so the child gets the default back.
    p = subprocess.Popen([sys.executable, "-m", "kopt", "bench", "--case", "1", "--device", "cpu", "--no-record",
                          "--candidate", str(cand), "--machine"], env=env, cwd=workspace,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 60
    while not list(tmp_path.glob("kopt-eval-*/result.json")) and time.time() < deadline:
        time.sleep(0.2)  # the child is evaluating (sleeping inside the candidate's run soon after)
    workers = _workers(p.pid)
    assert workers, "the evaluation child never started"
    time.sleep(1.0)
    p.send_signal(sig)
    try:
        _, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()  # never leave the run (and its sleeping child) behind a failed test
        for w in workers:
            os.kill(w, signal.SIGKILL)
        raise
    assert p.returncode in (130, 143), err
    assert "Traceback" not in err
    time.sleep(0.5)
    assert not any(_alive(w) for w in workers), "evaluation child left running"
