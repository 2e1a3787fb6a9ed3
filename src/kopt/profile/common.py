"""Shared pieces of the profiler adapters: the error type, the target command line, logged subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from kopt.errors import KoptError

#: Package root on sys.path for the target child (so `python -m kopt.profile.target` resolves
#: to this checkout even when kopt is not installed).
SRC_DIR = Path(__file__).resolve().parents[2]


class ProfileError(KoptError):
    """A profiler could not produce data (missing tool, failure, timeout): one line, exit 1."""


@dataclass
class TargetSpec:
    """What the profiled child process runs."""

    candidate: Path
    case: int
    device: str = "cuda"
    dtype: Optional[str] = None
    head_dim: Optional[int] = None
    page_size: Optional[int] = None
    seqlens: Optional[str] = None
    seed: int = 0
    warmup: int = 5
    cases_file: Optional[Path] = None
    config: Optional[str] = None
    extra: list[str] = field(default_factory=list)

    def argv(self, python: Optional[str] = None) -> list[str]:
        """`python -m kopt.profile.target ...` for this spec."""
        a = [python or sys.executable, "-m", "kopt.profile.target", "--candidate", str(self.candidate),
             "--case", str(self.case), "--device", self.device, "--seed", str(self.seed), "--warmup", str(self.warmup)]
        for flag, v in (("--dtype", self.dtype), ("--head-dim", self.head_dim), ("--page-size", self.page_size),
                        ("--seqlens", self.seqlens), ("--cases-file", self.cases_file), ("--config", self.config)):
            if v is not None:
                a += [flag, str(v)]
        return a + list(self.extra)


def child_env() -> dict[str, str]:
    """The environment for profiled children: this kopt first on PYTHONPATH, unbuffered output."""
    env = dict(os.environ)
    parts = [str(SRC_DIR)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(SRC_DIR)]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class Proc:
    """A finished child: exit status and its combined output (also written to the log file)."""

    rc: int
    output: str
    timed_out: bool = False


def run_logged(cmd: list[str], log: Path, timeout_s: float, cwd: Optional[Path] = None,
               env: Optional[dict] = None) -> Proc:
    """Run a command with a wall-clock limit; stdout+stderr go to `log` (appended) and are returned."""
    from kopt.eval.child import kill_group

    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        # Own process group: on timeout the profiler *and* the target it launched are stopped,
        # so no orphaned target keeps the GPU busy.
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                             cwd=cwd, env=env or child_env(), start_new_session=True)
    except OSError as e:
        raise ProfileError(f"cannot start {cmd[0]}: {e.strerror or e}") from None
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
    return Proc(rc, out, to)


def tail_lines(text: str, n: int = 3) -> str:
    """The last meaningful lines of a tool's output, joined for a one-line error."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("USDT:")]
    return " | ".join(lines[-n:])[:400]


def target_error(output: str) -> Optional[str]:
    """The target's own one-line error, when it printed one."""
    for ln in reversed(output.splitlines()):
        if "kopt-target: error:" in ln:
            return ln.split("kopt-target: error:", 1)[1].strip()
    return None
