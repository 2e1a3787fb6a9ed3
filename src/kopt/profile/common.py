"""Shared pieces of the profiler adapters: the error type, the target command line, logged runs (kopt.proc)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from kopt import proc
from kopt.errors import KoptError
from kopt.proc import Finished


class ProfileError(KoptError):
    """A profiler ran and could not produce data (failure, timeout, an unreadable report): one line, exit 1. A
    requested profiler that cannot run here at all is a UsageError (exit 2)."""


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
    heldout: int = 0
    heldout_seed: Optional[int] = None
    cases_file: Optional[Path] = None
    config: Optional[str] = None
    extra: list[str] = field(default_factory=list)

    def argv(self, python: Optional[str] = None) -> list[str]:
        """`python -m kopt.profile.target ...` for this spec."""
        a = [python or sys.executable, "-m", "kopt.profile.target", "--candidate", str(self.candidate),
             "--case", str(self.case), "--device", self.device, "--seed", str(self.seed), "--warmup", str(self.warmup)]
        for flag, v in (("--dtype", self.dtype), ("--head-dim", self.head_dim), ("--page-size", self.page_size),
                        ("--seqlens", self.seqlens), ("--cases-file", self.cases_file), ("--config", self.config),
                        ("--heldout-seed", self.heldout_seed)):
            if v is not None:
                a += [flag, str(v)]
        if self.heldout_seed is not None:
            a += ["--heldout", str(self.heldout)]
        return a + list(self.extra)


def run_logged(cmd: list[str], log: Path, timeout_s: float, cwd: Optional[Path] = None,
               env: Optional[dict] = None) -> Finished:
    """Run a profiler or target command with a wall-clock limit (kopt.proc.run_logged); ProfileError when it cannot
    start."""
    try:
        return proc.run_logged(cmd, log, timeout_s, cwd=cwd, env=env)
    except OSError as e:
        raise ProfileError(f"cannot start {cmd[0]}: {e.strerror or e}") from None


def number(text: str) -> Optional[float]:
    """A number as a profiler prints it ("1,203", "0.73"), None for an empty cell, n/a, NaN or "-"."""
    t = (text or "").strip().replace(",", "")
    if not t or t.lower() in ("n/a", "na", "nan", "-"):
        return None
    try:
        return float(t)
    except ValueError:
        return None


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
