"""The case matrix: validated models and the loader of bench/cases.yaml."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, field_validator, model_validator

from kopt.errors import CaseError, UsageError

PageSize = Optional[Literal[16, 32, 64, 256]]


class DType(str, Enum):
    """Element type of q and the KV cache."""

    fp16 = "fp16"
    bf16 = "bf16"


class Seqlens(str, Enum):
    """How cache_seqlens are filled: every sequence at full length, or seeded ragged lengths."""

    full = "full"
    ragged = "ragged"


class Variant(BaseModel):
    """The knobs a case can be run with; defaults come from the file, overrides from the CLI."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dtype: DType = DType.fp16
    head_dim: Literal[64, 128] = 128
    page_size: PageSize = None
    seqlens: Seqlens = Seqlens.full
    index_dtype: Literal["int32"] = "int32"

    def label(self) -> str:
        """Short text such as `fp16-d128-paged256-ragged` for tables and ledger rows."""
        layout = f"paged{self.page_size}" if self.page_size else "contig"
        return f"{self.dtype.value}-d{self.head_dim}-{layout}-{self.seqlens.value}"


class SeededLengths(BaseModel):
    """Ragged lengths drawn from a seeded generator: uniform integers in [lo, hi], one per sequence."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    uniform: tuple[PositiveInt, PositiveInt]
    """Inclusive bounds [lo, hi] of each sequence's length."""
    seed: int = Field(0, ge=0)

    def draw(self, n: int) -> list[int]:
        """n lengths, the same for every run and machine (Python's Mersenne Twister, no torch)."""
        import random

        rng = random.Random(self.seed)
        lo, hi = self.uniform
        return [rng.randint(lo, hi) for _ in range(n)]


#: A ragged case's lengths: an explicit list (one per sequence) or a seeded generator.
Lengths = Union[list[PositiveInt], SeededLengths]


class Case(BaseModel):
    """One benchmark shape of the workload. seqlen_k is the allocated cache length; a `ragged` case
    fills each sequence to its own length (`lengths`), the others every sequence to seqlen_k."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: int = Field(ge=1)
    batch: int = Field(ge=1)
    seqlen_k: int = Field(ge=1)
    kv_heads: int = Field(ge=1)
    gqa: int = Field(ge=1)
    kind: Literal["edge", "perf", "ragged", "seed", "heldout", "custom"]
    """edge / perf / ragged / seed: the named cases (seed: the seed projects' own model shapes, a group of their
    own); heldout: a draw from the workload library (kopt.workloads); custom: a shape given on the command line."""
    model: Optional[str] = None
    """The workload library's model a held-out or custom case comes from (None for the named cases)."""
    dist: Optional[str] = None
    """How a held-out or custom case's lengths were drawn (equal, uniform, lognormal, fewlong, list)."""
    c500_ref_ms: Optional[float] = Field(default=None, gt=0)
    """The seed's C500 baseline time: reference data, never used as a measurement."""
    lengths: Optional[Lengths] = None
    """cache_seqlens of a ragged case (required there, refused elsewhere)."""
    variant: Variant = Variant()

    @field_validator("lengths", mode="before")
    @classmethod
    def _one_form(cls, v):
        # A mapping is a generator, anything else a list: report that form's error, not the union's.
        if isinstance(v, dict):
            try:
                return SeededLengths.model_validate(v)
            except ValidationError as e:
                err = e.errors()[0]
                raise ValueError(f"{'.'.join(map(str, err['loc']))}: {err['msg']}") from None
        return v

    @model_validator(mode="after")
    def _check_lengths(self) -> Case:
        if self.kind == "ragged" and self.lengths is None:
            raise ValueError("a ragged case needs lengths")
        if self.lengths is not None and self.kind not in ("ragged", "heldout", "custom"):
            raise ValueError("only ragged, held-out and custom cases may have lengths")
        if isinstance(self.lengths, list):
            if len(self.lengths) != self.batch:
                raise ValueError(f"lengths has {len(self.lengths)} entries, batch is {self.batch}")
            if max(self.lengths) > self.seqlen_k:
                raise ValueError(f"a length ({max(self.lengths)}) exceeds seqlen_k ({self.seqlen_k})")
        elif self.lengths is not None:
            lo, hi = self.lengths.uniform
            if lo > hi or hi > self.seqlen_k:
                raise ValueError(f"lengths.uniform [{lo}, {hi}] must satisfy lo <= hi <= seqlen_k ({self.seqlen_k})")
        return self

    def seq_lengths(self) -> Optional[list[int]]:
        """The case's own per-sequence lengths (ragged cases), None when every sequence is full."""
        if self.lengths is None:
            return None
        return list(self.lengths) if isinstance(self.lengths, list) else self.lengths.draw(self.batch)

    @property
    def valid_keys(self) -> int:
        """Keys a call must read over the batch: the sum of the lengths (batch x seqlen_k when full)."""
        lens = self.seq_lengths()
        return self.batch * self.seqlen_k if lens is None else sum(lens)

    @property
    def capacity(self) -> int:
        """Keys the cache holds per sequence: seqlen_k, in whole pages when the variant is paged."""
        page = self.variant.page_size
        return -(-self.seqlen_k // page) * page if page else self.seqlen_k

    @property
    def q_heads(self) -> int:
        """Number of query heads."""
        return self.kv_heads * self.gqa

    def shape_label(self) -> str:
        """Heads, head dim, batch and longest length as one token, e.g. `hq32-hkv4-d64-b8-s1536-uniform`."""
        dist = f"-{self.dist}" if self.dist else ""
        return (f"hq{self.q_heads}-hkv{self.kv_heads}-d{self.variant.head_dim}-b{self.batch}-s{self.seqlen_k}"
                f"{dist}")

    def with_variant(self, **overrides) -> Case:
        """A copy with some variant fields replaced (None values are ignored; page_size 0 means contiguous)."""
        upd = {k: v for k, v in overrides.items() if v is not None}
        if upd.get("page_size") == 0:
            upd["page_size"] = None
        try:
            variant = Variant.model_validate({**self.variant.model_dump(), **upd})
        except ValidationError as e:
            err = e.errors()[0]
            raise CaseError(f"invalid variant {'.'.join(map(str, err['loc']))}: {err['msg']}") from None
        return self.model_copy(update={"variant": variant})

    def shape_dict(self) -> dict:
        """The plain shape description handed to a candidate's `configs(case)`."""
        v = self.variant
        return {"batch": self.batch, "seqlen_k": self.seqlen_k, "kv_heads": self.kv_heads,
                "gqa": self.gqa, "head_dim": v.head_dim, "dtype": v.dtype.value,
                "page_size": v.page_size}


class MatrixEntry(BaseModel):
    """Correctness-only variant runs of the Verdict: these cases with these variant fields."""

    model_config = ConfigDict(extra="forbid")

    cases: list[int] = Field(min_length=1)
    dtype: Optional[DType] = None
    head_dim: Optional[Literal[64, 128]] = None
    page_size: PageSize = None
    seqlens: Optional[Seqlens] = None


class VerifySpec(BaseModel):
    """The `verify:` section: fresh seeds per correctness run, the matrix, how many hidden variants."""

    model_config = ConfigDict(extra="forbid")

    seeds: int = Field(3, ge=1, le=16)
    matrix: list[MatrixEntry] = Field(default_factory=list)
    hidden: int = Field(4, ge=0, le=64)
    heldout: int = Field(12, ge=0, le=256)
    """Shapes drawn from the workload library (bench/workloads.yaml) and timed at every verdict."""


class CaseFile(BaseModel):
    """bench/cases.yaml as a whole."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = Field(1, ge=1)
    defaults: Variant = Variant()
    cases: list[Case]
    verify: VerifySpec = VerifySpec()

    @field_validator("cases")
    @classmethod
    def _unique_ids(cls, v: list[Case]) -> list[Case]:
        ids = [c.id for c in v]
        if len(ids) != len(set(ids)):
            raise ValueError("case ids must be unique")
        if not ids:
            raise ValueError("at least one case is required")
        return v


def read_yaml(p: Path, what: str, error: type[Exception] = CaseError):
    """The YAML document at p, or one `error` line naming the `what` file: missing, unreadable, or not YAML
    (ValueError: a malformed timestamp or similar scalar; RecursionError: absurd nesting)."""
    import yaml

    try:
        return yaml.safe_load(Path(p).read_text())
    except FileNotFoundError:
        raise error(f"{what} file not found: {p}") from None
    except (yaml.YAMLError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise error(f"{p}: not valid YAML{_where(e)} ({type(e).__name__})") from None
    except OSError as e:
        raise error(f"cannot read {what} file {p}: {e.strerror or e}") from None


def _where(e: Exception) -> str:
    """Where a YAML parser stopped and why, as ' at line L, column C: problem' (1-based, as an editor counts), or ''
    for an error that carries no position."""
    mark = getattr(e, "problem_mark", None)
    if mark is None:
        return ""
    problem = " ".join(str(getattr(e, "problem", "") or "").split())
    return f" at line {mark.line + 1}, column {mark.column + 1}" + (f": {problem}" if problem else "")


def invalid(p: Path, e: ValidationError) -> str:
    """The one line for a file that read as YAML but does not validate: its first error, and where."""
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"])
    return f"{p}: invalid{' at ' + loc if loc else ''}: {err['msg']}"


def load_cases(path: Path | None = None) -> list[Case]:
    """Load and validate the case file; each case gets the file's defaults as its variant."""
    return load_file(path).cases


def load_file(path: Path | None = None) -> CaseFile:
    """Load and validate the whole case file (cases sorted by id)."""

    from kopt.paths import cases_file

    p = Path(path) if path else cases_file()
    raw = read_yaml(p, "case")
    if not isinstance(raw, dict):
        raise CaseError(f"{p}: expected a mapping with 'cases'")
    try:
        defaults = Variant.model_validate(raw.get("defaults") or {})
        for c in raw.get("cases") or []:
            if isinstance(c, dict):  # a case's own variant fields over the file's defaults
                own = c.get("variant") or {}
                c["variant"] = defaults.model_dump() | (own if isinstance(own, dict) else {})
        cf = CaseFile.model_validate(raw)
    except ValidationError as e:
        raise CaseError(invalid(p, e)) from None
    except TypeError as e:
        raise CaseError(f"{p}: invalid structure ({e})") from None
    known = {c.id for c in cf.cases}
    for m in cf.verify.matrix:
        if bad := [i for i in m.cases if i not in known]:
            raise CaseError(f"{p}: verify.matrix names unknown case id {bad[0]}")
    cf.cases.sort(key=lambda c: c.id)
    return cf


def select(cases: list[Case], ids: list[int] | None = None, kind: str | None = None) -> list[Case]:
    """Pick cases by id (unknown ids raise, listing the valid ones) or by kind."""
    by_id = {c.id: c for c in cases}
    if ids:
        bad = [i for i in ids if i not in by_id]
        if bad:
            valid = ", ".join(str(i) for i in sorted(by_id))
            raise CaseError(f"unknown case id {bad[0]}; valid ids: {valid}")
        return [by_id[i] for i in ids]
    return [c for c in cases if kind is None or c.kind == kind]


def parse_ids(text: str | None, limit: int = 10_000) -> list[int] | None:
    """'1,3,5-7' -> [1, 3, 5, 6, 7]; None stays None; empty, reversed or huge ranges are usage errors."""
    if text is None:
        return None
    ids: list[int] = []
    bad = UsageError(f"invalid case list {text!r}: expected ids like 1,3,5-7")
    parts = [p.strip() for p in text.split(",")]
    if not any(parts):
        raise bad
    try:
        for part in parts:
            if not part:
                continue
            if "-" in part[1:]:
                a, b = (int(x) for x in part.split("-", 1))
                if b < a or b - a >= limit:
                    raise bad
                ids.extend(range(a, b + 1))
            else:
                ids.append(int(part))
            if len(ids) > limit:
                raise bad
    except ValueError:
        raise bad from None
    return ids


#: Kinds of named case the Verdict times: the uniform perf cases, the ragged batches and the seed shapes.
TIMED_KINDS = ("perf", "ragged", "seed")


def hidden_variant(case: Case) -> Case:
    """A shape the candidate has never been shown: 3 more sequences, 13 more cache slots, ragged lengths."""
    return reshaped(case, case.batch + 3, case.seqlen_k + 13).with_variant(seqlens="ragged")


def reshaped(case: Case, batch: int, seqlen_k: int) -> Case:
    """The case at another batch and cache length. A ragged case's own lengths fit only its own shape,
    so its reshaped copy drops them and becomes a perf case (callers ask for seeded ragged lengths), as does
    a reshaped seed, held-out or custom case (its group names its own shape);
    the copy is validated, never a silently inconsistent model_copy."""
    data = case.model_dump() | {"batch": batch, "seqlen_k": seqlen_k}
    if case.lengths is not None or case.kind not in ("edge", "perf"):
        data |= {"kind": "perf", "lengths": None, "model": None, "dist": None}
    return Case.model_validate(data)
