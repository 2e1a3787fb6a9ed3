"""Result models, the status vocabulary and the machine line.

Everything persisted is a pydantic model; "not measured" is None (printed `NA`), never -1.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from enum import Enum
from typing import Literal, Optional, get_args

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1


class Status(str, Enum):
    """One outcome per evaluation, in the machine line and the ledger."""

    ok = "ok"
    compile_error = "compile_error"          # import, syntax, missing `run`, compile failure
    runtime_error = "runtime_error"          # `run` raised
    unsupported = "unsupported"              # `run` raised ValueError for this shape
    timeout = "timeout"                      # wall-clock limit hit
    crash = "crash"                          # the child died: signal, abort, os._exit
    oom = "oom"                              # out of memory
    incorrect_numerical = "incorrect_numerical"
    incorrect_shape = "incorrect_shape"
    incorrect_dtype = "incorrect_dtype"
    nan_inf = "nan_inf"
    mutated_input = "mutated_input"
    stale_output = "stale_output"            # cached / reused output, aliasing, unwritten poison
    side_stream = "side_stream"              # work still running after `run` returned
    tampered = "tampered"                    # harness or torch entry points patched
    static_violation = "static_violation"
    implausible = "implausible"              # faster than the bandwidth roofline allows
    baseline_error = "baseline_error"        # the baseline itself failed; SPEEDUP is NA

    @property
    def compiled(self) -> bool:
        """Whether an outcome implies the candidate loaded and compiled."""
        return self not in (Status.compile_error, Status.static_violation)


#: How the cold flush evicts L2 before a timed call: read a zeroed buffer (L2 left clean), or zero it.
FlushKind = Literal["read", "zero"]
FLUSH_KINDS: tuple[str, ...] = get_args(FlushKind)
#: How device-only cold calls run: replays of a CUDA graph captured from each call, or launched on the stream.
Replay = Literal["graph", "stream"]
REPLAYS: tuple[str, ...] = get_args(Replay)


class TimingStats(BaseModel):
    """Summary of one timed function: every figure kept, not only the median."""

    model_config = ConfigDict(extra="ignore")

    method: Literal["cupti", "events", "graph", "host"]
    median_ms: float = Field(gt=0)
    q1_ms: float = Field(gt=0)
    q3_ms: float = Field(gt=0)
    min_ms: float = Field(gt=0)
    n: int = Field(ge=1)
    rel_iqr: float = Field(ge=0)
    """(q3 - q1) / median."""
    ci_rel: Optional[float] = Field(default=None, ge=0)
    """Half-width of the 95% CI of the median, relative to the median."""
    noisy: bool = False
    cold: bool = True
    flush_bytes: int = Field(0, ge=0)
    flush_kind: Optional[FlushKind] = None
    """How the cold flush evicted L2: read (a zeroed buffer read, L2 left clean) or zero (written)."""
    mean_clock_mhz: Optional[float] = None
    dropped_low_clock: int = Field(0, ge=0)
    events_median_ms: Optional[float] = None
    """CUDA-event time of the same calls: a cross-check, biased upwards by launch overhead."""
    total_s: Optional[float] = Field(default=None, ge=0)
    device_only: bool = False
    """Spans of calls enqueued ahead of the device behind a hold: no kernel waited for the host."""
    host_bound: int = Field(0, ge=0)
    """Device-only calls dropped because a kernel of theirs still waited for its launch."""
    side_stream: int = Field(0, ge=0)
    """Timed calls that left work on another stream without joining it to the caller's stream."""
    eager_median_ms: Optional[float] = Field(default=None, gt=0)
    """Median host-inclusive span: each call started on an idle device (the launches inside it)."""
    replay: Optional[Replay] = None
    """How the device-only calls ran: each a replay of a CUDA graph captured from it ("graph"), or its
    kernels launched on the stream ("stream"); None: not device-only (or a row from before replays)."""
    replay_note: str = ""
    """Why a graph replay was asked for and not used (capture failed, the replay ran other kernels or
    wrote another output than the call): empty when it was used."""


class Validation(BaseModel):
    """Correctness against the fp32 reference, tolerance from the baseline's own error."""

    correct: bool
    trials: int = Field(0, ge=0)
    max_abs_err: Optional[float] = None
    baseline_err: Optional[float] = None
    tolerance: Optional[float] = None
    detail: str = ""


class PeerResult(BaseModel):
    """One peer kernel of a `kopt peers` row: the candidate against it in ABBA rounds, or why it is NA."""

    model_config = ConfigDict(extra="ignore")

    peer: str
    """The adapter: fa2 | fa2-paged | fa3 | flashinfer | torch (kopt.baselines.PEERS), or cand-<id>: an earlier
    candidate's file timed as a peer."""
    ref: str = "NA"
    """What ran, with its version (e.g. fa3_fwd-0.0.3, flash_attn-2.8.3-paged256)."""
    na: Optional[str] = None
    """Why the peer could not run this case (not built for it, not importable, no GPU); None: it ran."""
    correct: Optional[bool] = None
    """Its output on the timed inputs against the fp32 reference (None: not checked). A wrong peer is
    reported, never the best peer."""
    message: str = ""
    timing: Optional[TimingStats] = None
    """The candidate's timing in this pairing."""
    ref_timing: Optional[TimingStats] = None
    """The peer's timing in this pairing."""
    speedup: Optional[float] = None
    """Median per-round peer / candidate time ratio: > 1 means the candidate is faster."""
    speedup_ci: Optional[tuple[float, float]] = None


class CaseResult(BaseModel):
    """One ledger row: one candidate evaluated on one case (and variant)."""

    model_config = ConfigDict(extra="ignore")

    schema_version: int = SCHEMA_VERSION
    row_id: str
    run_id: Optional[str] = None
    """Shared by every row of one `kopt bench` / `kopt verify` invocation."""
    timestamp: str = Field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    mode: Literal["signal", "verdict", "calibrate", "tune", "peers", "heldout", "screen", "e2e"] = "signal"
    """signal: kopt bench; verdict: kopt verify; screen: kopt verify --quick (never judged as a verdict); tune,
    peers, calibrate, e2e: those commands; heldout: the reigning candidate timed on a verdict's held-out draws."""
    verdict_rows: Optional[int] = Field(default=None, ge=1)
    """mode=verdict: the rows its `kopt verify` run writes in all (perf, matrix, hidden). A run with fewer rows
    in the ledger was stopped before its end and is no verdict (kopt.policy.ranking.latest_verdict)."""
    kind: Literal["case", "stagnation"] = "case"
    candidate_path: str = ""
    candidate_hash: str = ""
    candidate_id: str = ""
    parent_id: Optional[str] = None
    technique: Optional[str] = None
    hypothesis: Optional[str] = None
    config: Optional[dict] = None
    plan: Optional[dict] = None
    """What the candidate says it ran (its optional `plan_info` hook): tuned or heuristic config."""
    case: int = 0
    case_kind: Optional[Literal["edge", "perf", "ragged", "seed", "heldout", "custom"]] = None
    """The case's kind when it was measured: ragged, seed and held-out rows are judged apart from the uniform
    ones (kopt.eval.verdict's groups); None in rows written before ragged cases existed (all uniform)."""
    model: Optional[str] = None
    """A held-out or custom row: the workload library's model (or `shape-HQ-HKV-D`) it measured."""
    shape: Optional[str] = None
    """A held-out or custom row: its heads, head dim, batch, longest length and length distribution
    (kopt.cases.Case.shape_label): case ids of draws are positions in a draw, not shapes."""
    heldout_seed: Optional[int] = None
    """A verdict's held-out draw seed (kopt.workloads.draw): `kopt verify --heldout-seed` draws the same shapes."""
    paired_run: Optional[str] = None
    """mode=heldout rows: the verify run whose held-out draws this reigning candidate was timed on."""
    variant: str = ""
    backend: str = "NA"
    compiled: bool = False
    correct: bool = False
    status: Status = Status.ok
    message: str = ""
    runtime_ms: Optional[float] = None
    ref_runtime_ms: Optional[float] = None
    speedup: Optional[float] = None
    speedup_ci: Optional[tuple[float, float]] = None
    improvement: Optional[bool] = None
    """SPEEDUP over the reference passes the improvement rule (CI above 1, effect >= max(1%, 3 x the A/A spread)):
    the candidate beats the reference beyond the noise. Never a comparison with another candidate or config
    (rows run with a one-off --config leave it None; `kopt tune`'s GAIN is that comparison)."""
    noisy: Optional[bool] = None
    """The line's NOISY: SPEEDUP is not to be trusted to a few percent: its CI is wider than +-5%, or the ratio of
    the two pooled medians (REF_RUNTIME / RUNTIME) falls outside SPEEDUP_CI (the rounds disagree: the load
    changed during the run). None: not computed (older rows; their NOISY is the candidate's rel. IQR > 5%)."""
    gbps: Optional[float] = None
    pct_peak: Optional[float] = None
    """GBPS as % of the measured read ceiling (schema 1 rows: of the copy ceiling)."""
    limit_ms: Optional[float] = Field(default=None, gt=0)
    """The case's roofline limit: max(bytes moved / read ceiling, launch floor), ms."""
    pct_limit: Optional[float] = Field(default=None, ge=0)
    """limit_ms / runtime_ms as %: 100 is at the roofline."""
    eager_ms: Optional[float] = Field(default=None, gt=0)
    """The candidate's host-inclusive span (eager launches, the GPU may wait for the host), ms."""
    ref_eager_ms: Optional[float] = Field(default=None, gt=0)
    """The baseline's host-inclusive span, ms."""
    compile_s: Optional[float] = None
    device: str = "NA"
    units: Optional[int] = Field(default=None, ge=0)
    """SMs / APs / CPU cores of the device that measured the row; None when not recorded."""
    host: Optional[str] = None
    """The machine that measured the row (a node of a Ray cluster, a --gpus worker's host, the tuning host);
    None where not recorded (older rows, serial bench and verify runs)."""
    ref: str = "NA"
    timing: Optional[TimingStats] = None
    ref_timing: Optional[TimingStats] = None
    validation: Optional[Validation] = None
    versions: dict[str, str] = Field(default_factory=dict)
    overhead_s: dict[str, float] = Field(default_factory=dict)
    commit: Optional[str] = None
    seed: Optional[int] = None
    timing_sets: Optional[int] = Field(default=None, ge=1)
    """Input sets the timed calls rotated over, each its own allocation (None: older rows, two)."""
    static_warnings: list[str] = Field(default_factory=list)
    """Warnings of the static check (errors reject the candidate; warnings are shown, not fatal)."""
    peers: list[PeerResult] = Field(default_factory=list)
    """mode=peers rows: every peer of the panel; REF / SPEEDUP above are the best correct peer's."""

    def take_timings(self, timing: Optional[TimingStats], ref_timing: Optional[TimingStats]) -> None:
        """Both timings, and the line's figures taken from them (RUNTIME, REF_RUNTIME and their eager twins)."""
        self.timing, self.ref_timing = timing, ref_timing
        if timing:
            self.runtime_ms, self.eager_ms = timing.median_ms, timing.eager_median_ms
        if ref_timing:
            self.ref_runtime_ms, self.ref_eager_ms = ref_timing.median_ms, ref_timing.eager_median_ms


#: How people read a speedup or a geomean of speedups (fmt_na's fmt): 1.493x.
SPEEDUP_FMT = "{:.3f}x"


def fmt_na(v: Optional[float], fmt: str = "{:.4f}") -> str:
    """A number for people and the machine line (fmt.format(v)): NA when it was not measured."""
    return "NA" if v is None else fmt.format(v)


def machine_line(r: CaseResult) -> str:
    """The one stdout line: the six seed fields in order, then CASE, DEVICE, REF, STATUS, extras."""
    # a wrong output has no speed: SPEEDUP (and its CI) are NA whenever CORRECT is False
    speedup, ci = (r.speedup, r.speedup_ci) if r.correct else (None, None)
    fields = [
        f"COMPILED:{r.compiled}",
        f"CORRECT:{r.correct}",
        f"BACKEND:{_token(r.backend)}",
        f"RUNTIME:{fmt_na(r.runtime_ms)}",
        f"REF_RUNTIME:{fmt_na(r.ref_runtime_ms)}",
        f"SPEEDUP:{fmt_na(speedup, '{:.4f}x')}",
        f"CASE:{r.case}",
        f"DEVICE:{_token(r.device)}",
        f"REF:{_token(r.ref)}",
        f"STATUS:{r.status.value}",
    ]
    fields.append(f"SPEEDUP_CI:{ci[0]:.4f}-{ci[1]:.4f}" if ci else "SPEEDUP_CI:NA")
    noisy = r.noisy if r.noisy is not None else (r.timing.noisy if r.timing else None)
    fields.append(f"NOISY:{'NA' if noisy is None else int(noisy)}")
    fields.append(f"GBPS:{fmt_na(r.gbps, '{:.1f}')}")
    fields.append(f"PCT_PEAK:{fmt_na(r.pct_peak, '{:.1f}')}")
    fields.append(f"PCT_LIMIT:{fmt_na(r.pct_limit, '{:.1f}')}")
    fields.append(f"RUNTIME_EAGER:{fmt_na(r.eager_ms)}")
    fields.append(f"REF_RUNTIME_EAGER:{fmt_na(r.ref_eager_ms)}")
    fields.append(f"REPLAY:{(r.timing.replay if r.timing else None) or 'NA'}")
    fields.append(f"COMPILE_S:{fmt_na(r.compile_s, '{:.2f}')}")
    fields.append(f"VARIANT:{_token(r.variant)}")
    fields.append(f"CANDIDATE:{r.candidate_id or 'NA'}")
    if r.model:  # held-out and custom rows name their shape
        fields += [f"MODEL:{_token(r.model)}", f"SHAPE:{_token(r.shape or '')}"]
    return " ".join(fields)


def _token(s: Optional[str]) -> str:
    """Values in the line never contain spaces or colons."""
    return re.sub(r"[\s:]+", "_", str(s)) if s else "NA"


def token(s: Optional[str]) -> str:
    """Any text as one VALUE of a line: spaces and colons become `_`; empty is NA."""
    return _token(s)


def config_token(cfg: Optional[dict]) -> str:
    """A config as one VALUE without spaces or colons: `key=value` pairs, comma-joined, sorted by key
    (`--json` has the JSON object); NA when there is none."""
    import json

    if not cfg:
        return "NA"
    def value(v) -> str:  # numbers and words as they are; anything else as compact JSON, commas as `;`
        text = v if isinstance(v, str) else json.dumps(v, separators=(";", "="))
        return _token(text).replace(",", ";")

    return ",".join(f"{_token(k)}={value(v)}" for k, v in sorted(cfg.items()))


#: Every line kopt prints on stdout for agents (machine, VERDICT, TUNE, STOPPED, CALIBRATION... lines):
#: KEY:VALUE fields, one space apart, no value with a space (tests/engine/cli/test_grammar.py).
ANY_LINE = re.compile(r"^(\w+:\S+)( \w+:\S+)*$")


_FIELD = re.compile(r"([A-Z_]+):(\S+)")
LINE_RE = re.compile(
    r"^COMPILED:(True|False) CORRECT:(True|False) BACKEND:\S+ "
    r"RUNTIME:(NA|\d+\.\d+) REF_RUNTIME:(NA|\d+\.\d+) SPEEDUP:(NA|\d+\.\d+x)"
    r"( [A-Z_]+:\S+)*$"
)


def parse_line(line: str) -> dict[str, str]:
    """Parse a machine line into its KEY -> VALUE fields (raises ValueError when it is not one)."""
    line = line.strip()
    if not LINE_RE.match(line):
        raise ValueError(f"not a kopt machine line: {line[:80]!r}")
    return dict(_FIELD.findall(line))
