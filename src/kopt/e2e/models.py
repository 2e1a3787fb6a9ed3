"""What `kopt e2e` persists: the job a child runs, its result, the E2E machine line and the ledger row."""

from __future__ import annotations

import re
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from kopt.records import CaseResult, Status, TimingStats, Validation, fmt_na

SCHEMA_VERSION = 1


class E2EOptions(BaseModel):
    """One `kopt e2e` run: the model of the workload library, its size, the decode and where it runs."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    model: str
    """A model of bench/workloads.yaml: its query heads, KV heads and head dim make the decoder's attention."""
    layers: PositiveInt = 2
    batch: PositiveInt = 1
    prompt_len: PositiveInt = 32
    tokens: PositiveInt = 8
    """Decode steps (tokens generated greedily after the prefill's first)."""
    page_size: Optional[Literal[16, 32, 64, 256]] = None
    """The candidate's cache in pages of this many tokens (shuffled, one block table for every layer); None:
    contiguous."""
    dtype: Literal["fp16", "bf16"] = "bf16"
    device: Literal["cpu", "cuda"] = "cpu"
    seed: int = Field(0, ge=0)
    """Weights and prompt come from this seed."""
    graph: bool = True
    """On CUDA: each decode step replayed as a CUDA graph (as serving engines run it); the CPU runs eagerly."""
    warmup: int = Field(2, ge=0)
    """Timed steps left out of the medians (their first replays)."""
    fit_steps: int = Field(0, ge=0)
    """Steps the random decoder is fitted to continue a repeated block before it decodes (kopt.e2e.fit), so that
    its greedy tokens are decisive; the prompt then repeats a block too. 0: random weights, a random prompt."""


def check_context(o: E2EOptions, max_context: int) -> None:
    """A usage error when the prompt and the decoded tokens do not fit the model's context."""
    from kopt.errors import UsageError

    if o.prompt_len + o.tokens > max_context:
        raise UsageError(f"--prompt-len {o.prompt_len} + --tokens {o.tokens} exceed {o.model}'s context "
                         f"({max_context})")


class StepGap(BaseModel):
    """One decode step: the largest logit differences (over the batch and the vocabulary) and the allowance."""

    model_config = ConfigDict(extra="ignore")

    step: int = Field(ge=0)
    same: bool
    """Every sequence's greedy token of the candidate's own run equals the baseline's at this step."""
    vs_base: float
    """max |candidate - baseline| logits (candidate fed the baseline's tokens where the runs parted)."""
    vs_fp32: float
    """max |candidate - fp32-attention run| logits."""
    base_vs_fp32: float
    """max |baseline - fp32-attention run| logits: the baseline's own error."""
    allowed: float
    """kopt's tolerance rule on the logits: 2 x base_vs_fp32 + two ulps of the dtype at the largest logit."""


class E2EResult(BaseModel):
    """What one `kopt e2e` run found: tokens, logit gaps, step latencies, attention share, kernels seen."""

    model_config = ConfigDict(extra="ignore")

    schema_version: int = SCHEMA_VERSION
    options: E2EOptions
    passed: bool = False
    status: Status = Status.ok
    message: str = ""
    """Why it failed (the step and the gap), or a note on a pass (a token parted at a near tie)."""
    error_kind: Optional[Literal["usage", "candidate", "baseline"]] = None
    """Set when the run stopped: a usage error (exit 2), the candidate or the baseline failed (exit 1)."""
    candidate_id: str = ""
    candidate_path: str = ""
    backend: str = "NA"
    ref: str = "NA"
    """The baseline in the same place, with its version (and its cache layout when it differs)."""
    device: str = "NA"
    transformers: str = "NA"
    dims: dict[str, int] = Field(default_factory=dict)
    """The decoder built: hidden, intermediate, vocab, layers, heads, kv_heads, head_dim."""
    tokens_same: Optional[int] = Field(default=None, ge=0)
    """Steps whose greedy tokens equal the baseline's, up to the first that does not."""
    base_tokens_same_fp32: Optional[int] = Field(default=None, ge=0)
    """Steps whose greedy tokens of the baseline equal those of the same decoder with fp32 attention (each decoding
    its own tokens), up to the first that does not: how soon the baseline's own rounding parts the tokens, the yard
    stick for TOKENS_SAME on a decoder of random weights, whose logits are near ties at many steps."""
    steps: list[StepGap] = Field(default_factory=list)
    max_logit_diff: Optional[float] = None
    max_logit_diff_fp32: Optional[float] = None
    base_logit_diff_fp32: Optional[float] = None
    timing: Optional[TimingStats] = None
    """The candidate's decode step (method graph: CUDA events around each replay; host: the CPU's clock)."""
    ref_timing: Optional[TimingStats] = None
    null_timing: Optional[TimingStats] = None
    """The same step with the decode attention left out (its KV write kept): what the rest of the step costs."""
    step_speedup: Optional[float] = None
    """Baseline step / candidate step, medians."""
    attn_share: Optional[float] = None
    """1 - null step / candidate step: the candidate attention's share of its step."""
    ref_attn_share: Optional[float] = None
    kernels_seen: Optional[bool] = None
    """Every kernel of a standalone `run` call ran once per layer in the timed (replayed) step, and no baseline
    kernel did; None where a profiler cannot see device kernels (the CPU)."""
    kernels: dict[str, list[str]] = Field(default_factory=dict)
    """candidate / baseline: the kernels of their attention seen in the profiled steps."""
    calls: Optional[int] = Field(default=None, ge=0)
    """Calls of the candidate's `run` from the model (eager: layers x steps; a captured step: layers)."""
    compile_s: Optional[float] = None
    wall_s: Optional[float] = None
    fit_loss: Optional[float] = None
    """The fit's copy loss at its last step (nats a token; kopt.e2e.fit), None without a fit."""
    fit_steps_taken: Optional[int] = Field(default=None, ge=0)
    """Steps the fit took (it stops early once the copy is learned)."""
    fit_trace: list[tuple[int, float]] = Field(default_factory=list)
    """[step, loss] of the fit every 50 steps and at its last: whether and when it learned the copy."""
    fit_cached: Optional[bool] = None
    """True: the fitted decoder was loaded from the fit cache (the same fit, run before; kopt.e2e.fit.ENV_CACHE)."""
    fit_copy: Optional[float] = Field(default=None, ge=0, le=1)
    """A fitted decoder: the share of the decoded positions whose next token it predicts right, teacher-forced, in
    the run's dtype with the library's own attention (kopt.e2e.fit.copy_accuracy): below 1 the decoder, not an
    attention, misses the copy."""
    copied: Optional[int] = Field(default=None, ge=0)
    """A fitted decoder: steps at which the candidate's own tokens continue the prompt's block for every sequence
    (the task it was fitted to), up to the first that does not."""

    def line(self) -> str:
        """The E2E machine line: every field KEY:VALUE, NA for what was not measured."""
        o, g = self.options, "{:.4g}"
        ms = lambda t: fmt_na(t.median_ms if t else None)  # noqa: E731
        fields = {
            "E2E": "pass" if self.passed else "fail", "MODEL": o.model, "LAYERS": o.layers, "BATCH": o.batch,
            "PROMPT": o.prompt_len, "FIT_STEPS": fmt_na(self.fit_steps_taken, "{:d}"),
            "FIT_LOSS": fmt_na(self.fit_loss, "{:.3g}"), "FIT_COPY": fmt_na(self.fit_copy, "{:.4f}"),
            "TOKENS_SAME": f"{self.tokens_same}/{o.tokens}" if self.tokens_same is not None else "NA",
            "COPIED": f"{self.copied}/{o.tokens}" if self.copied is not None else "NA",
            "BASE_TOKENS_SAME_FP32": (f"{self.base_tokens_same_fp32}/{o.tokens}"
                                      if self.base_tokens_same_fp32 is not None else "NA"),
            "MAX_LOGIT_DIFF": fmt_na(self.max_logit_diff, g),
            "MAX_LOGIT_DIFF_FP32": fmt_na(self.max_logit_diff_fp32, g),
            "BASE_LOGIT_DIFF_FP32": fmt_na(self.base_logit_diff_fp32, g), "STEP_MS": ms(self.timing),
            "REF_STEP_MS": ms(self.ref_timing), "STEP_SPEEDUP": fmt_na(self.step_speedup, "{:.4f}x"),
            "ATTN_SHARE": fmt_na(self.attn_share, "{:.3f}"), "REF_ATTN_SHARE": fmt_na(self.ref_attn_share, "{:.3f}"),
            "KERNELS_SEEN": "NA" if self.kernels_seen is None else self.kernels_seen,
            "GRAPH": (self.timing.method == "graph") if self.timing else "NA", "DTYPE": o.dtype,
            "PAGE": o.page_size or 0, "DEVICE": self.device, "REF": self.ref, "CANDIDATE": self.candidate_id or "NA",
            "STATUS": self.status.value, "FAIL_STEP": self.fail_step(),
        }
        return " ".join(f"{k}:{_token(str(v))}" for k, v in fields.items())

    def fail_step(self) -> str:
        """The first step whose logits broke the rule or whose token parted from the baseline's (NA: none)."""
        for s in self.steps:
            if s.vs_fp32 > s.allowed or (not s.same and not self.passed):
                return str(s.step)
        return "NA"

    def row(self, run_id: Optional[str] = None) -> CaseResult:
        """The ledger row (mode e2e): step times as RUNTIME / REF_RUNTIME, the logit check as its validation."""
        import uuid

        from kopt.workloads import CUSTOM_ID

        o = self.options
        r = CaseResult(
            row_id=uuid.uuid4().hex[:16], run_id=run_id, mode="e2e", candidate_path=self.candidate_path,
            candidate_id=self.candidate_id, case=CUSTOM_ID, case_kind="custom", model=o.model,
            shape=f"L{o.layers}-b{o.batch}-p{o.prompt_len}-t{o.tokens}", backend=self.backend,
            variant=f"{o.dtype}-{'paged' + str(o.page_size) if o.page_size else 'contig'}",
            compiled=self.status.compiled, correct=self.passed, status=self.status, message=self.line(),
            speedup=self.step_speedup, compile_s=self.compile_s, device=self.device, ref=self.ref, seed=o.seed,
            validation=Validation(correct=self.passed, trials=o.tokens, max_abs_err=self.max_logit_diff_fp32,
                                  baseline_err=self.base_logit_diff_fp32,
                                  tolerance=min((s.allowed for s in self.steps), default=None),
                                  detail=self.message),
            versions={"transformers": self.transformers})
        r.take_timings(self.timing, self.ref_timing)
        return r


def _token(s: str) -> str:
    return re.sub(r"[\s:]+", "_", s) if s else "NA"


LINE_RE = re.compile(r"^E2E:(pass|fail)( [A-Z_0-9]+:\S+)+$")


def parse_line(line: str) -> dict[str, str]:
    """The KEY -> VALUE fields of an E2E line (ValueError when it is not one)."""
    line = line.strip()
    if not LINE_RE.match(line):
        raise ValueError(f"not a kopt e2e line: {line[:80]!r}")
    return dict(f.split(":", 1) for f in line.split(" "))


def latest_line(rows: list[dict]) -> Optional[str]:
    """The E2E line of the newest mode=e2e ledger row (the report's line), or None."""
    for r in reversed(rows):
        if r.get("mode") == "e2e" and str(r.get("message", "")).startswith("E2E:"):
            return str(r["message"])
    return None
