"""The tuning table, results/<backend>/tuning.csv: schema, tolerant read, atomic upsert, lookup.

One row per tuned shape and device: the config `kopt tune` picked, its cold median and the
default config's, and its gain over the default (a paired ABBA speedup with its CI when the
search paired finalists). Columns (schema_version 1):

    schema_version, device, units, dtype, head_dim, batch, seqlen_bucket, kv_heads, gqa,
    page_size, config, runtime_ms, default_runtime_ms, gain, gain_lo, gain_hi, timestamp, commit,
    candidate_id, quick, host, plan_version, capacity

`config` is a JSON object; `page_size` is 0 for a contiguous cache; `device` is kopt's short
device name (H200, C500, cpu) and `units` its SM / AP / core count. Unknown extra columns are
kept on rewrite; the optional ones (everything after `config`) may be missing.

Upsert replaces a row with the same key, except that a quick or partial search (`--quick`,
`--max-configs`) never replaces a full one of the same candidate (candidate_id): the better-measured
row of one kernel is kept. A row of
another candidate, or a row without candidate_id (older tables), is always replaced.

`plan_version` is the candidate's PLAN_VERSION (a module-level constant, read from its source:
kopt.candidate.plan_version) when the row was measured; `capacity` the tuned case's cache length.

Lookup rules (the candidate side, solution/tilelang/tuning_lookup.py, repeats them without
importing kopt; tests/kernel/test_tuning.py checks that both agree):

- bucket = the next power of two >= n, of the cache length (seqlen_bucket) and of the batch;
- a row applies to its own shape bucket only: equal device, units, dtype, head_dim, kv_heads,
  gqa, page_size, plan_version, seqlen bucket and batch bucket; the device matches when the
  normalised names are equal or the row's name is a whole token of the queried one (row `H200`
  matches the driver's `NVIDIA H200`); a row of another plan version was measured on another
  plan rule and never applies;
- among those, the nearest batch wins (ties: the smaller batch, then the later row); none
  left -> None (the kernel's rule). The candidate side may refuse a row whose own shape (its
  batch and capacity) has another plan class than the query's; the harness has no plan.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kopt.errors import LedgerError
from kopt.store.ledger import Loaded

SCHEMA_VERSION = 1
KEY = ("device", "units", "dtype", "head_dim", "batch", "seqlen_bucket", "kv_heads", "gqa", "page_size")
COLUMNS = ("schema_version",) + KEY + ("config", "runtime_ms", "default_runtime_ms", "gain", "gain_lo", "gain_hi",
                                       "timestamp", "commit", "candidate_id", "quick", "host", "plan_version",
                                       "capacity")
REQUIRED = KEY + ("config",)
_DTYPES = {"fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16",
           "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16"}


class TuningRow(BaseModel):
    """One tuned shape on one device: the winning config and what it gained over the default."""

    model_config = ConfigDict(extra="ignore")

    schema_version: int = Field(SCHEMA_VERSION, ge=1)
    device: str = Field(min_length=1)
    """kopt's short device name (H200, C500, cpu)."""
    units: int = Field(ge=0)
    """SMs / APs / CPU cores of the device; 0 when unknown."""
    dtype: Literal["fp16", "bf16"]
    head_dim: int = Field(ge=1)
    batch: int = Field(ge=1)
    seqlen_bucket: int = Field(ge=1)
    """Next power of two >= the tuned seqlen_k."""
    kv_heads: int = Field(ge=1)
    gqa: int = Field(ge=1)
    page_size: int = Field(0, ge=0)
    """0 for a contiguous cache."""
    config: dict
    runtime_ms: Optional[float] = Field(None, gt=0)
    """Cold median of the winning config (from its paired rounds with the default when it has them)."""
    default_runtime_ms: Optional[float] = Field(None, gt=0)
    """Cold median of the default config (first entry of configs()), same process as the winner."""
    gain: Optional[float] = Field(None, gt=0)
    """The winner's paired speedup over the default (median of per-round ratios); without paired
    figures (older rows, --finalists 0) default_runtime_ms / runtime_ms."""
    gain_lo: Optional[float] = Field(None, gt=0)
    """Lower end of the paired gain's 95% CI; None when the gain is not paired (or the default was kept)."""
    gain_hi: Optional[float] = Field(None, gt=0)
    """Upper end of the paired gain's 95% CI."""
    timestamp: str = Field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    commit: Optional[str] = None
    candidate_id: Optional[str] = None
    """The candidate (kopt.candidate.content_hash prefix) the row was tuned for."""
    quick: Optional[bool] = None
    """True for a quick or partial search (--quick: fewer samples; --max-configs: some configs only);
    None in older tables."""
    host: Optional[str] = None
    """The machine that measured the row (a Ray node, or the tuning host); None in older tables."""
    plan_version: Optional[str] = None
    """The candidate's PLAN_VERSION when the row was measured (kopt.candidate.plan_version); None: the candidate
    declares none, or an older table. A kernel applies only rows of its own version."""
    capacity: Optional[int] = Field(None, ge=1)
    """The tuned case's cache length (its seqlen_bucket's exact value); None in older tables."""

    @field_validator("plan_version", mode="before")
    @classmethod
    def _version(cls, v):
        return None if v is None else str(v)

    @field_validator("config", mode="before")
    @classmethod
    def _json_config(cls, v):
        if isinstance(v, str):
            v = json.loads(v)
        if not isinstance(v, dict):
            raise ValueError("config must be a JSON object")
        return v

    @field_validator("dtype", mode="before")
    @classmethod
    def _dtype(cls, v):
        return norm_dtype(v) if isinstance(v, str) else v

    @property
    def key(self) -> tuple:
        """The row's identity: the same key is one row (upsert replaces it)."""
        return tuple(getattr(self, k) for k in KEY)

    def cells(self) -> dict[str, str]:
        """The CSV cells of this row (None as an empty cell, config as compact JSON)."""
        out = {}
        for c in COLUMNS:
            v = getattr(self, c)
            out[c] = "" if v is None else json.dumps(v, sort_keys=True, separators=(",", ":")) if c == "config" \
                else repr(v) if isinstance(v, float) else str(v)
        return out


def bucket(n: int) -> int:
    """The bucket of a cache length (seqlen_bucket) or a batch: the next power of two >= n (1 for 0 or 1)."""
    return 1 << max(0, int(n) - 1).bit_length()


def norm_dtype(dtype) -> str:
    """fp16 / bf16 from any spelling (fp16, float16, torch.float16, a torch dtype)."""
    s = str(dtype).lower()
    return _DTYPES.get(s, s)


def _norm_device(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", str(name).lower()).strip("-")


def device_matches(row_device: str, query: str) -> bool:
    """Same device: equal normalised names, or the row's name is a whole token of the query's."""
    r, q = _norm_device(row_device), _norm_device(query)
    return bool(r) and (r == q or re.search(rf"(^|-){re.escape(r)}(-|$)", q) is not None)


def default_path(backend: str = "tilelang", root: Optional[Path] = None) -> Path:
    """<workspace>/results/<backend>/tuning.csv."""
    from kopt import paths

    return (root or paths.workspace()) / "results" / backend / "tuning.csv"


# ---------------------------------------------------------------- read / write

def _raw(path: Path) -> tuple[list[str], list[dict]]:
    """Header and raw rows of a CSV; ([], []) when the file does not exist."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return [], []
    except (OSError, UnicodeDecodeError) as e:
        raise LedgerError(f"cannot read tuning table {path}: {e}") from None
    reader = csv.DictReader(io.StringIO(text))
    try:
        rows = list(reader)
        return list(reader.fieldnames or []), rows
    except csv.Error as e:
        raise LedgerError(f"tuning table {path} is not valid CSV: {e}") from None


def parse(raw: dict) -> TuningRow:
    """A TuningRow from one raw CSV row (empty cells are missing values); raises ValueError."""
    cells = {k: v for k, v in raw.items() if k is not None and v not in (None, "")}
    return TuningRow.model_validate(cells)


def read(path: Path) -> Loaded:
    """Valid rows of a tuning table plus (line, reason) of the rows that did not validate.

    A missing file is an empty table; a header without the required columns is one skipped
    entry at line 1 (nothing else is read).
    """
    header, raws = _raw(path)
    out = Loaded()
    if not header and not raws:
        return out
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        out.skipped.append((1, f"missing columns {', '.join(missing)}"))
        return out
    for i, raw in enumerate(raws, start=2):
        try:
            out.rows.append(parse(raw))
        except (ValidationError, ValueError) as e:
            out.skipped.append((i, _reason(e)))
    return out


def _reason(e: Exception) -> str:
    if isinstance(e, ValidationError):
        err = e.errors()[0]
        return f"{'.'.join(map(str, err['loc'])) or 'row'}: {err['msg']}"
    return str(e)[:200]


def _lock(path: Path):
    from filelock import FileLock

    return FileLock(str(path) + ".lock", timeout=60)


def write(path: Path, rows: list[TuningRow]) -> Path:
    """Replace the table with these rows (atomically: temp file in the same folder, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _lock(path):
        _write_raw(path, list(COLUMNS), [r.cells() for r in rows])
    return path


def _write_raw(path: Path, header: list[str], rows: list[dict]) -> None:
    from kopt import atomic

    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=header, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in header})
    atomic.write_text(path, buf.getvalue(), newline="")


def upsert(path: Path, new: list[TuningRow]) -> Path:
    """Insert or replace rows by key under a file lock; other rows (and extra columns) are kept as they were.

    A row that does not parse is kept verbatim (never silently dropped); a table whose header
    lacks a required column is refused (LedgerError) rather than rewritten.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _lock(path):
        header, raws = _raw(path)
        if header and (missing := [c for c in REQUIRED if c not in header]):
            raise LedgerError(f"tuning table {path} lacks columns {', '.join(missing)}; fix or move it first")
        by_key = {r.key: r for r in new}
        kept, held = [], set()
        for raw in raws:
            try:
                old = parse(raw)
                if old.key in by_key:
                    if not _keeps(old, by_key[old.key]):
                        continue
                    held.add(old.key)  # a full measurement of the same kernel outranks a quick one
            except (ValidationError, ValueError):
                pass  # unparseable rows stay as they are
            kept.append(raw)
        new = [r for r in new if r.key not in held]
        cols = list(COLUMNS) + [c for c in header if c and c not in COLUMNS]
        _write_raw(path, cols, kept + [r.cells() for r in new])
    return path


def _keeps(old: TuningRow, new: TuningRow) -> bool:
    """Whether an existing row survives an upsert of `new` with the same key."""
    return bool(new.quick) and old.quick is False and old.candidate_id is not None \
        and old.candidate_id == new.candidate_id


# ---------------------------------------------------------------- lookup

def nearest(rows: list[TuningRow], *, device: str, units: Optional[int], dtype, head_dim: int, batch: int,
            seqlen_k: int, kv_heads: int, gqa: int, page_size: Optional[int],
            plan_version: Optional[str] = None) -> Optional[TuningRow]:
    """The row of this shape's own bucket (and plan version) the rules pick, or None (see the module docstring)."""
    want_b = int(batch)
    version = None if plan_version is None else str(plan_version)
    exact = (int(units or 0), norm_dtype(dtype), int(head_dim), int(kv_heads), int(gqa), int(page_size or 0),
             bucket(seqlen_k), bucket(want_b), version)
    best, best_score = None, None
    for i, r in enumerate(rows):
        if (r.units, r.dtype, r.head_dim, r.kv_heads, r.gqa, r.page_size, r.seqlen_bucket, bucket(r.batch),
                r.plan_version) != exact:
            continue
        if not device_matches(r.device, device):
            continue
        score = (round(abs(math.log2(r.batch / want_b)), 9), r.batch, -i)
        if best_score is None or score < best_score:
            best, best_score = r, score
    return best


def lookup(path: Path, **query) -> Optional[dict]:
    """The tuned config for a shape from a table file, or None (missing table, no row of its bucket)."""
    loaded = read(path)
    r = nearest(loaded.rows, **query)
    return dict(r.config) if r else None
