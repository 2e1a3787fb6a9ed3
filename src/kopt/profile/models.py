"""Persisted profiling results: summary.json of a `kopt profile` run.

"Not measured" is None (printed NA) with a reason next to it, never a made-up number.
"""

from __future__ import annotations

from datetime import datetime, timezone
from enum import Enum
from typing import Optional, Union

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1

Number = Optional[Union[float, int, str]]


class Score(str, Enum):
    """How much a dimension limits the kernel."""

    ok = "ok"
    watch = "watch"
    limiting = "limiting"
    na = "NA"


class Tool(str, Enum):
    """Which profiler produced the data."""

    ncu = "ncu"
    torch = "torch"
    mcprofiler = "mcprofiler"
    mctracer = "mctracer"


class KernelMetrics(BaseModel):
    """Curated metrics of one profiled kernel launch, keyed by kopt's short names (see ncu.METRICS)."""

    model_config = ConfigDict(extra="ignore")

    name: str
    launch_id: Optional[int] = None
    metrics: dict[str, Optional[float]] = Field(default_factory=dict)
    """Short name -> value in kopt's units (ns, bytes, %, cycles); None = not reported."""
    raw: dict[str, str] = Field(default_factory=dict)
    """Tool metric name -> value text exactly as the tool printed it."""
    missing: dict[str, str] = Field(default_factory=dict)
    """Short name -> why it is NA."""


class HotInstruction(BaseModel):
    """One SASS instruction of a profiled kernel with the warp stalls ncu sampled on it (kopt profile --source)."""

    kernel: str
    offset: int
    """Bytes from the kernel's first instruction (cuobjdump's offsets), not a load address."""
    sass: str
    samples: int
    share_pct: float
    """Of all the samples taken in this kernel launch (its block of the source page)."""
    stalls: dict[str, int] = Field(default_factory=dict)
    """Stall reason (ncu's column, less its stall_ prefix) -> samples, the largest first, zeros left out."""
    waits_on: str = ""
    """What it waits behind, read from the SASS before it: the barrier or scoreboard wait right before it (DEPBAR:
    cp.async groups; BAR: the CTA's threads), else the nearest earlier writer of a register it reads, as
    "0x0120 LDG.E R4, desc[...]" (program order: inside a loop the writer may be the previous iteration's)."""


class Dimension(BaseModel):
    """One of the six diagnosis dimensions."""

    key: str
    title: str
    score: Score = Score.na
    evidence: dict[str, Number] = Field(default_factory=dict)
    reason: str = ""
    """One line: why this score (or why NA)."""
    patterns: list[str] = Field(default_factory=list)
    """Letters of knowledge/profiling/diagnosis_checklist.md this finding points to."""
    advice: str = ""


class Diagnosis(BaseModel):
    """The six dimensions for the dominant kernel (or the whole call where a timeline is all there is)."""

    kernel: Optional[str] = None
    units: Optional[int] = None
    unit_name: str = "SM"
    source: str = ""
    """What the scores rest on: ncu counters, a kineto timeline, mcProfiler counters..."""
    dimensions: list[Dimension] = Field(default_factory=list)

    def limiting(self) -> list[Dimension]:
        """Dimensions scored limiting, in table order."""
        return [d for d in self.dimensions if d.score == Score.limiting]


class ProfileSummary(BaseModel):
    """summary.json of one `kopt profile` run."""

    model_config = ConfigDict(extra="ignore")

    schema_version: int = SCHEMA_VERSION
    created: str = Field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    case: int = Field(ge=1)
    variant: str = ""
    shape: dict = Field(default_factory=dict)
    candidate_path: str = ""
    candidate_id: str = ""
    backend: str = "NA"
    tool: Tool
    requested_tool: str = "auto"
    device: str = "NA"
    """cuda / cpu as the target ran."""
    device_name: str = "NA"
    out_dir: str = ""
    """Relative to the workspace."""
    files: list[str] = Field(default_factory=list)
    """Raw outputs kept next to the summary (names relative to out_dir)."""
    commands: list[list[str]] = Field(default_factory=list)
    kernels: list[KernelMetrics] = Field(default_factory=list)
    timeline: Optional[dict] = None
    """kopt.profile.trace.summarize(...).to_dict() of the timeline, when one was taken."""
    diagnosis: Diagnosis = Field(default_factory=Diagnosis)
    ideal_bytes: Optional[int] = None
    """Bytes a decode call must move (kopt.workload.bytes_moved)."""
    copy_ceiling_gbps: Optional[float] = None
    config: Optional[dict] = None
    """The run(config=...) profiled (--config); None: the candidate's own plan."""
    hot: list[HotInstruction] = Field(default_factory=list)
    """--source: the instructions holding the most sampled warp stalls, the most first (source_sass.csv has all)."""
    notes: list[str] = Field(default_factory=list)
    """Fallbacks taken, unverified formats, tools missing."""


def config_text(config: Optional[dict]) -> Optional[str]:
    """A profiled config as one canonical JSON text (sorted keys), None for the candidate's own plan."""
    import json

    return None if config is None else json.dumps(config, sort_keys=True)
