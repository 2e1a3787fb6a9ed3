"""The tuning run's persisted data: the job a tuning child reads, and what it reports per config and per shard."""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, Field

from kopt.cases import Case
from kopt.eval.jobs import SavedOutput
from kopt.records import Status, TimingStats, Validation


class ConfigResult(BaseModel):
    """One config of one case: compile time, screened cold and hot timing, saved outputs, verdict, paired figures."""

    index: int
    config: Optional[dict] = None
    shard: int = 0
    status: Optional[Status] = None
    message: str = ""
    compile_s: Optional[float] = None
    cold: Optional[TimingStats] = None
    hot: Optional[TimingStats] = None
    outputs: list[SavedOutput] = Field(default_factory=list)
    dir: str = ""
    correct: Optional[bool] = None
    """Set by the parent once the outputs were checked against the reference."""
    validation: Optional[Validation] = None
    paired_speedup: Optional[float] = Field(None, gt=0)
    """Finalists only: median per-round time(default) / time(this config) from ABBA rounds."""
    paired_ci: Optional[tuple[float, float]] = None
    """Bootstrap 95% CI of paired_speedup."""
    paired_a: Optional[TimingStats] = None
    """This config's cold timing in the paired rounds."""
    paired_b: Optional[TimingStats] = None
    """The default's cold timing in the same rounds."""


class TuneJob(BaseModel):
    """One shard of one case's config list, written as job.json."""

    candidate_path: str
    case: Case
    device: str
    shard: int = Field(0, ge=0)
    shards: int = Field(1, ge=1)
    max_configs: Optional[int] = Field(None, ge=1)
    indices: Optional[list[int]] = None
    """Config indices to run (a rerun after a crash); None: this shard's share of the selection."""
    seeds_correct: list[int]
    seeds_timing: list[int]
    quick: bool = False
    hot: bool = True
    baseline: str = "auto"
    prewarm: bool = False
    part: int = Field(0, ge=0)
    parts: int = Field(1, ge=1)
    """With prewarm: this child compiles every parts-th config of the shard, starting at part."""
    finalists: int = Field(3, ge=0)
    """Configs (besides the default) paired against the default after the screen; 0: none."""
    configs: Optional[list[dict]] = None
    """--config: search these configs beside the candidate's default instead of configs(case)."""
    prior: list[ConfigResult] = Field(default_factory=list)
    """Results of earlier children of this shard (a rerun): reported again and ranked for the finalists."""
    out_dir: str


class ShardResult(BaseModel):
    """What a tuning child reports (rewritten after every config and every finalist)."""

    phase: str = "start"
    status: Optional[Status] = None
    message: str = ""
    backend: str = "NA"
    device_name: str = "NA"
    units: int = 0
    n_configs: int = 0
    """len(configs(case)) before --max-configs."""
    selected: list[int] = Field(default_factory=list)
    indices: list[int] = Field(default_factory=list)
    current: Optional[int] = None
    """The config in progress: the one to blame when the child dies."""
    current_config: Optional[dict] = None
    hot_error: Optional[str] = None
    """Why hot (graph) timing was switched off in this child; reruns then skip it."""
    results: list[ConfigResult] = Field(default_factory=list)
    finalists: Optional[list[int]] = None
    """Configs picked for pairing against the default; None: the finalist stage has not started."""
    pair_error: Optional[str] = None
    """Why the finalist stage stopped early (the unpaired finalists then have no paired figures)."""
    ref_name: str = "NA"
    ref_cold: Optional[TimingStats] = None
    versions: dict[str, str] = Field(default_factory=dict)
    overhead_s: dict[str, float] = Field(default_factory=dict)
    wall_s: float = 0.0
    """Set by the parent: wall time of this shard, children and checks included."""
    host: Optional[str] = None
    """Set by the parent: the machine that ran this shard (a Ray node, or this host)."""
    retried: Optional[str] = None
    """Set by the head: why the executor ran this shard a second time (its first node or worker died)."""
    stopped: bool = False
    """Set by the parent: the budget (`kopt tune --budget`) ended before or during this shard: the case is not run."""
    not_applicable: str = ""
    """Why there is nothing to tune on this device (every config runs one plan there); empty: the search ran."""
