"""`kopt lab campaign FILE`: a GPU campaign as a declarative file of named steps, run in order, logged and packed.

The file (YAML, e.g. workflows/campaign-h200.yaml):

    schema_version: 1
    budget_s: 3600            # optional: a step that would start with less than MIN_LEFT_S left is skipped
    steps:
      - name: bench           # its logs: logs/bench.out (stdout) and logs/bench.err (stderr)
        run: kopt bench --all --cold-cache --machine
        timeout_s: 420        # optional (DEFAULT_TIMEOUT_S); the step's process group is ended past it
        needs: [prewarm]      # optional: earlier steps that must have succeeded when they run in this campaign

A step runs `kopt ARGS` (this kopt, as `python -m kopt`) or `python ARGS` (this interpreter), words split as a
shell splits them, nothing expanded; from the workspace root. Every step runs, whatever the one before did: a
failure, a timeout or a step that could not start is a line of logs/steps.txt and of the summary, with the reason in
the step's .err log; a step is skipped only for its `needs` or the budget, and says so. At the end the ledger is
copied to logs/candidates.jsonl and OUT/campaign.tgz packs logs/ and the workspace's results/ (what `kopt import`
reads: the archive holds one candidates.jsonl); logs/campaign.json holds every step's result.
"""

from __future__ import annotations

import shlex
import sys
import time
from enum import Enum
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kopt.errors import UsageError

DEFAULT_TIMEOUT_S = 600.0
#: A step that would start with less than this left of the budget is skipped (it could do nothing useful).
MIN_LEFT_S = 20.0
#: A timed-out step is sent SIGTERM (a kopt command then ends its own children) and killed this long after.
GRACE_S = 15.0
ARCHIVE = "campaign.tgz"
PROGRAMS = ("kopt", "python", "python3")


class Step(BaseModel):
    """One named step of a campaign."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=80)
    """Its name: the names of its logs (logs/NAME.out, logs/NAME.err)."""
    run: str
    """The command line: `kopt ARGS` or `python ARGS`."""
    timeout_s: float = Field(DEFAULT_TIMEOUT_S, gt=0)
    """Wall-clock limit of the step, seconds."""
    needs: list[str] = []
    """Earlier steps that must have succeeded, when they run in the same campaign."""

    @field_validator("run")
    @classmethod
    def _program(cls, v: str) -> str:
        try:
            words = shlex.split(v)
        except ValueError as e:
            raise ValueError(f"cannot split the command line ({e})") from None
        if not words or words[0] not in PROGRAMS:
            raise ValueError(f"a step runs `kopt ...` or `python ...`, got {v[:40]!r}")
        return v

    def argv(self) -> list[str]:
        """The command as this interpreter runs it."""
        words = shlex.split(self.run)
        head = [sys.executable, "-m", "kopt"] if words[0] == "kopt" else [sys.executable]
        return head + words[1:]


class CampaignFile(BaseModel):
    """A campaign: its steps in order and an optional overall budget."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1
    budget_s: Optional[float] = Field(None, gt=0)
    """Overall budget, seconds; None: no budget beyond each step's timeout."""
    steps: list[Step] = Field(min_length=1)

    @model_validator(mode="after")
    def _names(self) -> CampaignFile:
        seen: set[str] = set()
        for s in self.steps:
            if s.name in seen:
                raise ValueError(f"step name {s.name!r} is used twice")
            if bad := [n for n in s.needs if n not in seen]:
                raise ValueError(f"step {s.name!r} needs {bad[0]!r}, which is no earlier step")
            seen.add(s.name)
        return self


class StepStatus(str, Enum):
    ok = "ok"
    failed = "failed"
    timeout = "timeout"
    skipped = "skipped"
    error = "error"
    """It could not start (or the campaign was interrupted while it ran)."""


class StepResult(BaseModel):
    """What one step did."""

    name: str
    command: str
    status: StepStatus
    rc: Optional[int] = None
    wall_s: Optional[float] = Field(None, ge=0)
    reason: str = ""

    def line(self) -> str:
        """Its line in steps.txt and the progress."""
        parts = [self.name, self.status.value]
        if self.rc is not None:
            parts.append(f"rc={self.rc}")
        if self.wall_s is not None:
            parts.append(f"wall_s={self.wall_s:.3f}")
        return " ".join(parts) + (f": {self.reason}" if self.reason else "")


class CampaignResult(BaseModel):
    """Every step's result, in order (logs/campaign.json)."""

    schema_version: Literal[1] = 1
    file: str
    steps: list[StepResult] = []
    archive: Optional[str] = None

    @property
    def ok(self) -> bool:
        """Whether every step that was asked for ran and succeeded."""
        return all(s.status == StepStatus.ok for s in self.steps)


def load(path: Path) -> CampaignFile:
    """Read and validate a campaign file; anything wrong is a usage error naming the file and the place."""
    from kopt.cases import invalid, read_yaml

    raw = read_yaml(Path(path), "campaign", UsageError)
    try:
        return CampaignFile.model_validate(raw)
    except ValidationError as e:
        raise UsageError(invalid(path, e)) from None


def select(cf: CampaignFile, names: Optional[list[str]]) -> list[Step]:
    """The steps to run: all, or those named (in the file's order); an unknown name is a usage error."""
    if not names:
        return list(cf.steps)
    known = [s.name for s in cf.steps]
    if bad := [n for n in names if n not in known]:
        raise UsageError(f"unknown step{'s' if len(bad) > 1 else ''} {', '.join(bad)}; the file's steps: "
                         f"{', '.join(known)}")
    return [s for s in cf.steps if s.name in names]


def dry_run(steps: list[Step]) -> list[str]:
    """What a run would do: one line per step, its command as written, its limit and needs."""
    return [f"{s.name}: {s.run}  [timeout {s.timeout_s:g} s" + (f"; needs {', '.join(s.needs)}" if s.needs else "")
            + "]" for s in steps]


def run_step(step: Step, logs: Path, ws: Path, limit_s: float) -> StepResult:
    """Run one step from the workspace root, stdout and stderr in its logs, ended past `limit_s`."""
    from kopt import proc

    out, err = logs / f"{step.name}.out", logs / f"{step.name}.err"
    env = proc.child_env() | {"KOPT_WORKSPACE": str(ws)}
    t0 = time.perf_counter()
    try:
        p = proc.spawn(step.argv(), out, env=env, err_log=err, cwd=ws)
    except OSError as e:
        err.write_text(f"kopt lab campaign: cannot start {step.run!r}: {e}\n")
        return StepResult(name=step.name, command=step.run, status=StepStatus.error, reason=f"cannot start: {e}")
    try:
        rc, timed_out = proc.wait(p, t0 + limit_s, grace_s=GRACE_S)
    except BaseException:  # Ctrl-C or SIGTERM: end the step (and its own children) before unwinding
        proc.stop(p, GRACE_S)
        raise
    wall = time.perf_counter() - t0
    if timed_out:
        with open(err, "a") as fh:
            fh.write(f"\nkopt lab campaign: {step.name} ended after its limit of {limit_s:g} s\n")
        return StepResult(name=step.name, command=step.run, status=StepStatus.timeout, rc=rc, wall_s=wall,
                          reason=f"ended after its limit of {limit_s:g} s (see logs/{err.name})")
    status = StepStatus.ok if rc == 0 else StepStatus.failed
    if rc != 0:  # the log says it too, for whoever reads the log alone
        with open(err, "a") as fh:
            fh.write(f"\nkopt lab campaign: {step.name} exited with {rc}\n")
    return StepResult(name=step.name, command=step.run, status=status, rc=rc, wall_s=wall,
                      reason="" if rc == 0 else f"exit {rc} (see logs/{err.name})")


def run(cf: CampaignFile, steps: list[Step], out: Path, ws: Path, source: str, budget_s: Optional[float] = None,
        pack_only: bool = False, emit=print) -> CampaignResult:
    """Run `steps` of `cf` in order from the workspace `ws`, logs under OUT/logs, each step's line to `emit` as it
    ends; then pack (pack_only: OUT keeps campaign.tgz and steps.txt alone). `budget_s` overrides the file's."""
    from kopt import proc

    logs = out / "logs"
    if (logs / "steps.txt").exists() or (out / ARCHIVE).exists():
        raise UsageError(f"{out} already holds a campaign's logs: give another --out")
    logs.mkdir(parents=True, exist_ok=True)
    budget = budget_s if budget_s is not None else cf.budget_s
    deadline = time.perf_counter() + budget if budget else None
    res = CampaignResult(file=source)
    status: dict[str, StepStatus] = {}
    try:
        with proc.reaping():
            for s in steps:
                left = None if deadline is None else deadline - time.perf_counter()
                failed_need = next((n for n in s.needs if n in status and status[n] != StepStatus.ok), None)
                if failed_need:
                    r = StepResult(name=s.name, command=s.run, status=StepStatus.skipped,
                                   reason=f"needs {failed_need}, which was {status[failed_need].value}")
                elif left is not None and left < MIN_LEFT_S:
                    r = StepResult(name=s.name, command=s.run, status=StepStatus.skipped,
                                   reason=f"past the budget ({max(left, 0):.0f} s left)")
                else:
                    try:
                        r = run_step(s, logs, ws, s.timeout_s if left is None else min(s.timeout_s, left))
                    except BaseException:
                        res.steps.append(StepResult(name=s.name, command=s.run, status=StepStatus.error,
                                                    reason="the campaign was interrupted while it ran"))
                        raise
                res.steps.append(r)
                status[s.name] = r.status
                with open(logs / "steps.txt", "a") as fh:
                    fh.write(r.line() + "\n")
                emit(r.line())
    finally:
        finish(res, out, ws, pack_only)
    return res


def finish(res: CampaignResult, out: Path, ws: Path, pack_only: bool = False) -> Path:
    """The ledger copied into the logs, logs/campaign.json, then OUT/campaign.tgz of logs/ and the workspace's
    results/ (the format `kopt import` reads); pack_only: logs/ removed, steps.txt kept beside the archive."""
    import shutil
    import tarfile

    from kopt import paths

    logs = out / "logs"
    ledger = paths.ledger_file(ws)
    if ledger.is_file():
        shutil.copyfile(ledger, logs / "candidates.jsonl")
    (logs / "steps.txt").touch()
    res.archive = paths.relative(out / ARCHIVE, ws)
    (logs / "campaign.json").write_text(res.model_dump_json(indent=1) + "\n")
    with tarfile.open(out / ARCHIVE, "w:gz") as tar:
        tar.add(logs, arcname="logs")
        if (ws / "results").is_dir():
            tar.add(ws / "results", arcname="results")
    if pack_only:
        shutil.copyfile(logs / "steps.txt", out / "steps.txt")
        shutil.rmtree(logs)
    return out / ARCHIVE


def summary(res: CampaignResult) -> str:
    """One line: how many steps succeeded, which did not and why, where the archive is."""
    bad = [f"{s.name} ({s.status.value}{f' rc={s.rc}' if s.rc not in (None, 0) else ''})" for s in res.steps
           if s.status != StepStatus.ok]
    ok = len(res.steps) - len(bad)
    return (f"campaign: {ok}/{len(res.steps)} steps ok" + (f"; not ok: {', '.join(bad)}" if bad else "")
            + f"; archive {res.archive}")
