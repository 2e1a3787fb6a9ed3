"""The GPU test matrix in shards side by side, then its failures alone, as one record.

The matrix (tests/gpu, `-m gpu`, about 400 tests) compiles a kernel per test, so one pytest process takes most of an
hour; N processes side by side compile in parallel. On a card with less memory, side by side the tests with the
largest caches can run out of memory while each passes alone. So the failures of the side-by-side pass are run
again in one process. The record keeps both passes: each shard's summary, each failure with its reason, and what the
rerun said.

The pytest processes are kopt children (kopt.proc). The tests are collected once (`pytest --collect-only`) and
dealt round-robin to the shards by node id, so the split needs nothing from the suite's own conftest. Each shard
process gets KOPT_GPU_TESTS_SHARD=i/n in its environment; the rerun does not.
"""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, Field

from kopt.errors import UsageError

#: The environment variable a shard process gets (i/n); a rerun process has none.
SHARD_ENV = "KOPT_GPU_TESTS_SHARD"
#: Seconds a shard (or the rerun) may run before it is stopped, by default.
DEFAULT_TIMEOUT_S = 1800.0

_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")
_OUTCOME = re.compile(r"^(FAILED|ERROR) (\S+)(?: - (.*))?$")


class Counts(BaseModel):
    """One pytest process's outcome counts, from its summary line."""

    passed: int = 0
    failed: int = 0
    skipped: int = 0
    errors: int = 0

    def __add__(self, other: Counts) -> Counts:
        return Counts(**{k: getattr(self, k) + getattr(other, k) for k in Counts.model_fields})


class Failure(BaseModel):
    """A test that failed (or errored) and its reason: pytest's one-line summary of it."""

    node: str
    reason: str = ""


class Pass(BaseModel):
    """One pytest process: its tests' node ids, counts, failures, summary line, wall time and exit code."""

    label: str
    tests: int
    counts: Counts = Field(default_factory=Counts)
    failures: list[Failure] = Field(default_factory=list)
    summary: str = ""
    wall_s: float = 0.0
    returncode: Optional[int] = None
    timed_out: bool = False


class MatrixResult(BaseModel):
    """The side-by-side shards, the rerun of their failures alone (None when nothing failed) and the totals."""

    collected: int
    shards: list[Pass]
    rerun: Optional[Pass] = None
    wall_s: float = 0.0

    @property
    def side_by_side(self) -> Counts:
        total = Counts()
        for s in self.shards:
            total = total + s.counts
        return total

    @property
    def side_by_side_failures(self) -> list[Failure]:
        return [f for s in self.shards for f in s.failures]

    @property
    def side_by_side_nodes(self) -> list[str]:
        """The node ids that failed side by side, each once (a failure and its teardown error are one node)."""
        return failed_nodes(self.shards)

    @property
    def incomplete(self) -> list[str]:
        """Labels of the passes that did not finish (stopped at their timeout or ended without a summary)."""
        return [p.label for p in [*self.shards, *([self.rerun] if self.rerun else [])] if p.timed_out or not p.summary]

    @property
    def final(self) -> Counts:
        """The totals once the failures' rerun replaced their side-by-side outcome."""
        sbs = self.side_by_side
        if self.rerun is None:
            return sbs
        r = self.rerun.counts
        return Counts(passed=sbs.passed + r.passed, failed=r.failed, skipped=sbs.skipped + r.skipped, errors=r.errors)

    @property
    def ok(self) -> bool:
        """Every collected test passed or was skipped, once rerun where it failed side by side, and every pass
        finished."""
        f = self.final
        return not f.failed and not f.errors and not self.incomplete and f.passed + f.skipped == self.collected

    @property
    def status(self) -> str:
        """pass; fail (a test failed after the rerun, or a pass did not finish); NA (nothing failed, but nothing ran
        either: every test skipped, as the GPU tests do on a host without one)."""
        if not self.ok:
            return "fail"
        return "pass" if self.final.passed else "NA"

    def line(self) -> str:
        """The machine-parsable line of the matrix."""
        f, rerun = self.final, self.rerun.counts if self.rerun else Counts()
        incomplete = ",".join(self.incomplete) or "NA"
        return (f"GPU_TESTS:{self.status} COLLECTED:{self.collected} PASSED:{f.passed} "
                f"FAILED:{f.failed} ERRORS:{f.errors} SKIPPED:{f.skipped} "
                f"SIDE_BY_SIDE_FAILED:{len(self.side_by_side_nodes)} RERUN_PASSED:{rerun.passed} "
                f"SHARDS:{len(self.shards)} INCOMPLETE:{incomplete} WALL_S:{self.wall_s:.0f}")


def failed_nodes(passes: list[Pass]) -> list[str]:
    """The node ids that failed in any of `passes`, each once, in order."""
    return list(dict.fromkeys(f.node for p in passes for f in p.failures))


def parse_counts(summary: str) -> Counts:
    """Counts from pytest's last line ('1 failed, 31 passed, 1 skipped, 370 deselected in 231.02s'); an xfailed test
    counts as skipped and an xpassed one as passed."""
    c = Counts()
    for n, what in _COUNT.findall(summary):
        key = {"error": "errors", "errors": "errors", "passed": "passed", "failed": "failed", "skipped": "skipped",
               "xfailed": "skipped", "xpassed": "passed"}.get(what)  # an expected failure is not a failure
        if key:
            setattr(c, key, getattr(c, key) + int(n))
    return c


def parse_output(text: str) -> tuple[Counts, list[Failure], str]:
    """(counts, failures, summary line) of one pytest run's output (pytest -q -rfE)."""
    lines = [x.rstrip() for x in text.splitlines()]
    summary = next((x.strip("= ").strip() for x in reversed(lines)
                    if re.search(r"\b(passed|failed|skipped|errors?|deselected|no tests ran)\b", x)
                    and re.search(r" in [\d.]+s", x)), "")
    failures = []
    for x in lines:
        m = _OUTCOME.match(x)
        if m:
            failures.append(Failure(node=m.group(2), reason=(m.group(3) or "").strip()[:300]))
    return parse_counts(summary), failures, summary


def _pytest(args: list[str], cwd: Path) -> list[str]:
    """pytest in this interpreter, rooted at cwd (node ids are then paths from cwd, whatever the suite's layout),
    leaving no cache or benchmark folder behind."""
    from kopt import proc

    return proc.python_module("pytest", "-p", "no:cacheprovider", "-p", "no:benchmark", f"--rootdir={cwd}", *args)


def _env(extra: Optional[dict] = None) -> dict:
    """A kopt child's environment (kopt.proc), with no bytecode written beside the tests (kopt's own cache folder
    where the environment gives one, else none written), pytest's summary lines not cut at 80 columns, plus `extra`."""
    from kopt import proc

    env = proc.child_env()
    if not env.get("PYTHONPYCACHEPREFIX"):
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return {**env, "COLUMNS": "400", **(extra or {})}


def collect(paths: list[str], marker: str, keyword: str, cwd: Path) -> list[str]:
    """The node ids pytest collects for `paths` under `-m marker` and `-k keyword` (run from cwd); a usage error
    when pytest cannot collect them."""
    from kopt import proc

    args = ["--collect-only", "-q", *(["-m", marker] if marker else []), *(["-k", keyword] if keyword else []),
            *paths]
    with tempfile.TemporaryDirectory() as tmp:
        done = proc.run_logged(_pytest(args, cwd), Path(tmp) / "collect.log", 600.0, cwd=cwd, env=_env())
    ids: list[str] = []
    for x in done.output.splitlines():  # the ids come first; a blank line or a section (warnings) ends them
        if not x.strip() or x.startswith("="):
            break
        if "::" in x and not x.startswith(" ") and x.strip() not in ids:
            ids.append(x.strip())
    if done.rc not in (0, 5) or (done.rc == 0 and not ids):
        tail = done.output.strip().splitlines()[-1:] or ["no output"]
        raise UsageError(f"pytest could not collect {' '.join(paths)}: {tail[0][:200]}")
    return ids


def deal(ids: list[str], shards: int) -> list[list[str]]:
    """The node ids dealt round-robin to at most `shards` non-empty shards (neighbouring tests, often one kernel's
    variants, land in different shards)."""
    n = max(1, min(shards, len(ids)))
    return [ids[i::n] for i in range(n)]


def run_pass(label: str, ids: list[str], marker: str, cwd: Path, timeout_s: float,
             env: Optional[dict] = None) -> Pass:
    """One pytest process over `ids` (a kopt child, kopt.proc: in a session of its own, so a timeout ends whatever
    the tests started too), its output in a temporary file, stopped at `timeout_s`."""
    from kopt import proc

    args = ["-q", "-rfE", *(["-m", marker] if marker else []), *ids]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "pass.log"
        rc, timed_out = proc.wait(proc.spawn(_pytest(args, cwd), log, env=_env(env), cwd=cwd), t0 + timeout_s)
        counts, failures, summary = parse_output(log.read_text(errors="replace"))
    return Pass(label=label, tests=len(ids), counts=counts, failures=failures, summary=summary,
                wall_s=time.perf_counter() - t0, returncode=rc, timed_out=timed_out)


def run(paths: list[str], shards: int, cwd: Path, marker: str = "gpu", keyword: str = "",
        timeout_s: float = DEFAULT_TIMEOUT_S, emit: Callable[[str], None] = print,
        budget_s: Optional[float] = None) -> MatrixResult:
    """Collect, run the shards side by side (a progress line as each ends), then rerun their failures alone. Each
    pass stops at timeout_s; with budget_s, the rerun also stops when the whole run reaches it (so a caller's own
    limit still gets a record)."""
    if shards < 1:
        raise UsageError(f"--shards must be at least 1 (got {shards})")
    t0 = time.perf_counter()
    if budget_s is not None:
        timeout_s = min(timeout_s, budget_s)
    ids = collect(paths, marker, keyword, cwd)
    if not ids:
        raise UsageError(f"no test of {' '.join(paths)} matches" + (f" -m {marker}" if marker else "")
                         + (f" -k {keyword!r}" if keyword else ""))
    groups = deal(ids, shards)
    n = len(groups)
    emit(f"{len(ids)} tests in {n} shard(s) side by side")

    def one(i: int) -> Pass:
        p = run_pass(f"shard {i}/{n}", groups[i], marker, cwd, timeout_s, {SHARD_ENV: f"{i}/{n}"})
        emit(f"{p.label}: {p.summary or 'no summary'}{' (stopped at its timeout)' if p.timed_out else ''}")
        return p

    with ThreadPoolExecutor(n) as pool:
        done = list(pool.map(one, range(n)))
    failed = failed_nodes(done)
    rerun = None
    if failed:
        left = timeout_s if budget_s is None else min(timeout_s, budget_s - (time.perf_counter() - t0))
        emit(f"{len(failed)} failed side by side: rerun alone")
        rerun = run_pass("rerun alone", failed, marker, cwd, max(1.0, left))
        emit(f"{rerun.label}: {rerun.summary or 'no summary'}")
    return MatrixResult(collected=len(ids), shards=done, rerun=rerun, wall_s=time.perf_counter() - t0)


def record(result: MatrixResult, paths: list[str], marker: str, keyword: str, facts: dict) -> str:
    """The record of a matrix run (results/<backend>/gpu-tests-*.txt): what ran where, each shard's summary, the
    side-by-side failures with their reasons, the rerun, the totals and the machine line."""
    what = " ".join(paths) + (f" -m {marker}" if marker else "") + (f" -k {keyword!r}" if keyword else "")
    f, sbs = result.final, result.side_by_side
    head = [f"# {what}: {result.collected} collected, {len(result.shards)} shards side by side, then their failures "
            "alone",
            "# " + ", ".join(f"{k} {v}" for k, v in facts.items()),
            f"# side by side: {sbs.passed} passed, {sbs.failed} failed, {sbs.errors} errors, {sbs.skipped} skipped; "
            f"after the rerun: {f.passed} passed, {f.failed} failed, {f.errors} errors, {f.skipped} skipped"]
    body = ["## shards"] + [f"{s.label} ({s.tests} tests, {s.wall_s:.0f} s): {s.summary or 'no summary'}"
                            + (" (stopped at its timeout)" if s.timed_out else "") for s in result.shards]
    if result.side_by_side_failures:
        body += ["## failed side by side"] + [f"{x.node} - {x.reason or 'no reason printed'}"
                                              for x in result.side_by_side_failures]
    if result.rerun is not None:
        r = result.rerun
        body += [f"## rerun alone ({r.tests} tests, {r.wall_s:.0f} s)", r.summary or "no summary"]
        body += [f"still failing: {x.node} - {x.reason or 'no reason printed'}" for x in r.failures]
    return "\n".join(head + body + [result.line()]) + "\n"
