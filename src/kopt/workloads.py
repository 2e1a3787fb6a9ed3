"""The workload library (bench/workloads.yaml): model attention shapes people deploy, length distributions,
batches, page sizes and dtypes; seeded held-out draws from it, and a user's own shape as a case.

The named cases are a sample; a draw here is the target a candidate never saw. A draw depends on its seed
alone (Python's Mersenne Twister, no torch), so `kopt verify --heldout-seed S` reproduces it anywhere.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, field_validator, model_validator

from kopt.cases import Case, DType, PageSize, invalid, read_yaml
from kopt.errors import CaseError

#: Case ids of held-out draws start after this (row i of a draw is HELDOUT_BASE + i, from 1).
HELDOUT_BASE = 1000
#: The case id of a shape given on the command line (`kopt bench --model / --shape`).
CUSTOM_ID = 999
#: On a CPU a draw keeps its heads, head dim, dtype, layout and length distribution, at this size at most.
CPU_BATCH, CPU_MAX_LEN = 4, 256


class Model(BaseModel):
    """One model's decode attention per GPU: heads, head dim and the longest context it serves."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    q_heads: PositiveInt
    kv_heads: PositiveInt
    head_dim: Literal[64, 128]
    max_context: PositiveInt

    @model_validator(mode="after")
    def _grouped(self) -> Model:
        if self.q_heads % self.kv_heads:
            raise ValueError(f"q_heads ({self.q_heads}) is not a multiple of kv_heads ({self.kv_heads})")
        return self

    @property
    def gqa(self) -> int:
        """Query heads per KV head."""
        return self.q_heads // self.kv_heads


class LengthDist(BaseModel):
    """How long the sequences of a batch are, given the draw's maximum length (file comment: the four kinds)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["equal", "uniform", "lognormal", "fewlong"]
    sigma: float = Field(1.0, gt=0, le=4)
    """lognormal: the spread of log(length)."""
    every: int = Field(8, ge=2)
    """fewlong: one sequence in this many is long."""

    def draw(self, batch: int, max_len: int, rng: random.Random) -> list[int]:
        """batch lengths in [1, max_len]; the longest is max_len (the cache is allocated for it)."""
        if self.kind == "equal":
            return [max_len] * batch
        if self.kind == "uniform":
            out = [rng.randint(1, max_len) for _ in range(batch)]
        elif self.kind == "lognormal":
            mu = math.log(max(1.0, max_len / 8))
            out = [min(max_len, max(1, round(math.exp(rng.gauss(mu, self.sigma))))) for _ in range(batch)]
        else:
            short = max(1, max_len // 16)
            out = [max_len if i % self.every == 0 else rng.randint(1, short) for i in range(batch)]
            rng.shuffle(out)
        out[rng.randrange(batch)] = max_len
        return out


class WorkloadFile(BaseModel):
    """bench/workloads.yaml as a whole."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = Field(1, ge=1)
    models: list[Model] = Field(min_length=1)
    lengths: list[LengthDist] = Field(min_length=1)
    batches: list[PositiveInt] = Field(min_length=1)
    page_sizes: list[PageSize] = Field(min_length=1)
    dtypes: list[DType] = Field(min_length=1)
    max_cache_bytes: PositiveInt = 2 << 30
    min_context: PositiveInt = 64

    @field_validator("models")
    @classmethod
    def _unique(cls, v: list[Model]) -> list[Model]:
        names = [m.name for m in v]
        if dup := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"model names must be unique ({dup[0]} repeats)")
        return v

    def model(self, name: str) -> Model:
        """The model called `name` (a usage error naming the valid ones otherwise)."""
        for m in self.models:
            if m.name == name:
                return m
        raise CaseError(f"unknown model {name!r}; valid models: {', '.join(m.name for m in self.models)}")


def workloads_file(root: Optional[Path] = None) -> Path:
    """bench/workloads.yaml of the workspace, or the shipped one (kopt.template) when the workspace has none."""
    from kopt import template
    from kopt.paths import workspace

    p = (root or workspace()) / "bench" / "workloads.yaml"
    return p if p.is_file() else template.file("bench/workloads.yaml")


def load(path: Optional[Path] = None) -> WorkloadFile:
    """Load and validate the library; a bad entry is one CaseError naming the file and the field."""

    p = Path(path) if path else workloads_file()
    raw = read_yaml(p, "workload")
    if not isinstance(raw, dict):
        raise CaseError(f"{p}: expected a mapping with 'models'")
    try:
        return WorkloadFile.model_validate(raw)
    except ValidationError as e:
        raise CaseError(invalid(p, e)) from None


def _case(case_id: int, kind: str, m: Model, lens: list[int], page: Optional[int], dtype: str, dist: str) -> Case:
    return Case.model_validate({
        "id": case_id, "batch": len(lens), "seqlen_k": max(lens), "kv_heads": m.kv_heads, "gqa": m.gqa,
        "kind": kind, "lengths": lens, "model": m.name, "dist": dist,
        "variant": {"dtype": dtype, "head_dim": m.head_dim, "page_size": page, "seqlens": "ragged"}})


def draw(wf: WorkloadFile, n: int, seed: int, cpu: bool = False) -> list[Case]:
    """n held-out cases from seed alone: distinct models while they last, then any; each with a batch, a
    maximum length log-uniform in [min_context, the model's context] within max_cache_bytes, a length
    distribution, a page size and a dtype. `cpu`: the same draws cut to CPU_BATCH x CPU_MAX_LEN."""
    rng = random.Random(seed)
    models = rng.sample(wf.models, min(n, len(wf.models)))
    models += [rng.choice(wf.models) for _ in range(n - len(models))]
    out = []
    for i, m in enumerate(models, 1):
        dist, batch = rng.choice(wf.lengths), rng.choice(wf.batches)
        page, dtype = rng.choice(wf.page_sizes), rng.choice(wf.dtypes)
        lo, hi = math.log(min(wf.min_context, m.max_context)), math.log(m.max_context)
        max_len = round(math.exp(rng.uniform(lo, hi)))
        per_pos = batch * 2 * m.kv_heads * m.head_dim * 2  # K and V, 2-byte elements
        max_len = max(1, min(max_len, wf.max_cache_bytes // per_pos))
        lens = dist.draw(batch, max_len, rng)
        if cpu:
            lens = [max(1, -(-x * min(max_len, CPU_MAX_LEN) // max_len)) for x in lens[:CPU_BATCH]]
        out.append(_case(HELDOUT_BASE + i, "heldout", m, lens, page, dtype.value, dist.kind))
    return out


def draw_ids(n: int) -> str:
    """The case ids of a whole draw of `n` held-out shapes, as --case takes them ("1001-1012")."""
    return f"{HELDOUT_BASE + 1}-{HELDOUT_BASE + n}"


def pick(named: list[Case], ids: list[int], heldout: int, seed: Optional[int], cpu: bool = False) -> list[Case]:
    """Cases `ids` of the named cases or, with a seed, of that seed's `heldout` draws (ids HELDOUT_BASE + 1 ..,
    as `kopt verify --heldout N --heldout-seed S` numbers them). A held-out id without a seed, or past the draw, is
    a CaseError that says what to add."""
    from kopt.cases import select

    held = [i for i in ids if i > HELDOUT_BASE]
    if held and seed is None:
        raise CaseError(f"case {held[0]} is a held-out draw: give the verdict's --heldout-seed S (and its --heldout N, "
                        "the draw's size)")
    if held and max(held) > HELDOUT_BASE + heldout:
        raise CaseError(f"case {max(held)} is not in a draw of {heldout}: held-out ids are {HELDOUT_BASE + 1}-"
                        f"{HELDOUT_BASE + heldout} (--heldout N sets the draw's size)")
    return select(named + (draw(load(), heldout, seed, cpu) if held else []), ids)


def one_case(named: list[Case], case_id: int, heldout: int, seed: Optional[int], cpu: bool = False) -> Case:
    """pick's one case."""
    return pick(named, [case_id], heldout, seed, cpu)[0]


def parse_lengths(spec: str, batch: int, seed: int = 0) -> tuple[list[int], str]:
    """`--lengths`: N (every sequence at N), a comma list (one per sequence), or KIND:MAX[:P] with KIND one of
    uniform, lognormal (P: sigma), fewlong (P: every); returns (lengths, distribution name)."""
    spec = spec.strip()
    try:
        if "," in spec:
            lens = [int(x) for x in spec.split(",")]
            if len(lens) != batch:
                raise CaseError(f"--lengths lists {len(lens)} lengths, --batch is {batch}")
            kind = "list"
        elif ":" in spec:
            kind, *rest = spec.split(":")
            if kind not in ("uniform", "lognormal", "fewlong") or not 1 <= len(rest) <= 2:
                raise ValueError
            extra = {"sigma": float(rest[1])} if kind == "lognormal" and len(rest) == 2 else \
                {"every": int(rest[1])} if kind == "fewlong" and len(rest) == 2 else {}
            lens = LengthDist(kind=kind, **extra).draw(batch, int(rest[0]), random.Random(seed))
        else:
            lens, kind = [int(spec)] * batch, "equal"
    except (ValueError, ValidationError):
        raise CaseError(f"--lengths {spec!r}: want N, a comma list of {batch} lengths, or uniform:MAX, "
                        "lognormal:MAX[:SIGMA], fewlong:MAX[:EVERY]") from None
    if min(lens) < 1:
        raise CaseError(f"--lengths {spec!r}: every length must be at least 1")
    return lens, kind


def parse_shape(spec: str) -> Model:
    """`--shape HQ,HKV,D` as an unnamed model (a usage error names what is wrong)."""
    try:
        hq, hkv, d = (int(x) for x in spec.split(","))
        return Model(name=f"shape-{hq}-{hkv}-{d}", q_heads=hq, kv_heads=hkv, head_dim=d, max_context=1 << 30)
    except ValidationError as e:
        raise CaseError(f"--shape {spec!r}: {e.errors()[0]['msg']}") from None
    except ValueError:
        raise CaseError(f"--shape {spec!r}: want QUERY_HEADS,KV_HEADS,HEAD_DIM (e.g. 32,8,128)") from None


def custom_case(m: Model, batch: int, lengths: str, page_size: Optional[int] = None, dtype: str = "fp16") -> Case:
    """A user's own shape as a case (`kopt bench --model / --shape`): CASE CUSTOM_ID, kind custom."""
    if batch < 1:
        raise CaseError(f"--batch must be at least 1 (got {batch})")
    if dtype not in [d.value for d in DType]:
        raise CaseError(f"--dtype must be one of {', '.join(d.value for d in DType)} (got {dtype!r})")
    if page_size not in (None, 0, 16, 32, 64, 256):
        raise CaseError(f"--page-size must be one of 0, 16, 32, 64, 256 (got {page_size})")
    lens, dist = parse_lengths(lengths, batch)
    return _case(CUSTOM_ID, "custom", m, lens, page_size or None, dtype, dist)
