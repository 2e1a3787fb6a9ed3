"""Tuned configs at run time: read the tuning table `kopt tune` writes and pick a row for a shape.

Standalone on purpose (stdlib only; torch only inside `lookup_for`): a candidate may not import
the harness, so the small key and bucket logic of the harness's table module is repeated here;
the harness's tests check that both pick the same row.

Table: <repo>/results/tilelang/tuning.csv, where <repo> is two folders above this file's folder
(this file lives in <repo>/solution/tilelang/); `lookup(..., path=)` reads another file. Columns used:
device, units, dtype, head_dim, batch, seqlen_bucket, kv_heads, gqa, page_size (0 = contiguous),
config (a JSON object), plan_version (the kernel's PLAN_VERSION the row was measured on) and capacity
(the tuned shape's cache length); others are ignored.

Rules (the same as the harness's):
- bucket = the next power of two >= n, for the cache length (seqlen_bucket) and for the batch;
- a row applies to its own shape bucket only: equal device, units, dtype, head_dim, kv_heads, gqa,
  page_size, plan version, seqlen bucket and batch bucket; the device matches when the normalised
  names are equal or the row's name (kopt's short name, e.g. H200) is a whole token of the queried
  one (the driver's name, e.g. "NVIDIA H200");
- a row of another plan version is skipped (one warning per table version): it was measured on
  another plan rule;
- among the rows left (and those `accept(batch, capacity)` takes: the kernel's own check that the
  row's shape has the query's plan class), the nearest batch wins (ties: the smaller batch, then
  the later row); none -> None, and the kernel uses its rule.

A missing, unreadable or malformed table never breaks `run`: one warning per problem and file
version, then None. Parsed tables are cached per (path, mtime, size), so a call costs a stat.
"""
import csv
import json
import math
import os
import re
import warnings
from pathlib import Path
from typing import NamedTuple, Optional

DEFAULT_TABLE = Path(__file__).resolve().parents[2] / "results/tilelang/tuning.csv"
_REQUIRED = ("device", "units", "dtype", "head_dim", "batch", "seqlen_bucket", "kv_heads", "gqa", "page_size",
             "config")
_DTYPES = {"fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16",
           "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16"}
_CACHE = {}    # path -> ((mtime_ns, size), rows)
_WARNED = set()


class Row(NamedTuple):
    """One parsed row of the table."""

    device: str
    units: int
    dtype: str
    head_dim: int
    batch: int
    seqlen_bucket: int
    kv_heads: int
    gqa: int
    page_size: int
    config: dict
    #: the kernel's PLAN_VERSION the row was measured on, as text; None in older tables
    plan_version: Optional[str]
    #: the tuned shape's cache length; None in older tables
    capacity: Optional[int]


def table_path():
    """The tuning table this process reads: the repository's results table."""
    return DEFAULT_TABLE


def bucket(n):
    """The next power of two >= n (1 for 0 or 1): the bucket of a cache length or a batch."""
    return 1 << max(0, int(n) - 1).bit_length()


def norm_dtype(dtype):
    """fp16 / bf16 from any spelling (fp16, float16, torch.float16, a torch dtype)."""
    s = str(dtype).lower()
    return _DTYPES.get(s, s)


def _norm_device(name):
    return re.sub(r"[^a-z0-9]+", "-", str(name).lower()).strip("-")


def device_matches(row_device, query):
    """Equal normalised names, or the row's name is a whole token of the queried name."""
    r, q = _norm_device(row_device), _norm_device(query)
    return bool(r) and (r == q or re.search("(^|-)" + re.escape(r) + "(-|$)", q) is not None)


def _warn_once(path, stamp, message):
    key = (str(path), stamp, message)
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(f"tuning table {path}: {message}; using the kernel's heuristics", RuntimeWarning,
                      stacklevel=4)


def _row(raw):
    """The Row of one CSV row; raises ValueError / KeyError / TypeError when malformed."""
    cfg = json.loads(raw["config"])
    if not isinstance(cfg, dict):
        raise ValueError("config is not a JSON object")
    dtype = norm_dtype(raw["dtype"].strip())
    if dtype not in ("fp16", "bf16"):
        raise ValueError(f"dtype {raw['dtype']!r}")
    ints = [int(raw[k] or 0) if k in ("units", "page_size") else int(raw[k])
            for k in ("units", "head_dim", "batch", "seqlen_bucket", "kv_heads", "gqa", "page_size")]
    if min(ints[1:6]) < 1 or ints[0] < 0 or ints[6] < 0:
        raise ValueError("non-positive size")
    device = raw["device"].strip()
    if not device:
        raise ValueError("empty device")
    version = (raw.get("plan_version") or "").strip() or None
    capacity = int(raw["capacity"]) if (raw.get("capacity") or "").strip() else None
    return Row(device, ints[0], dtype, *ints[1:], cfg, version, capacity)


def load(path=None):
    """Rows of the table (Row tuples). Missing or malformed tables give [] after one warning; malformed rows are
    skipped (warned once)."""
    path = Path(path) if path is not None else table_path()
    try:
        st = path.stat()
    except OSError:
        _warn_once(path, None, "not found")
        return []
    stamp = (st.st_mtime_ns, st.st_size)
    hit = _CACHE.get(str(path))
    if hit is not None and hit[0] == stamp:
        return hit[1]
    rows = []
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in _REQUIRED if c not in (reader.fieldnames or [])]
            if missing:
                _warn_once(path, stamp, "missing columns " + ", ".join(missing))
            else:
                for raw in reader:
                    try:
                        rows.append(_row(raw))
                    except (ValueError, KeyError, TypeError, AttributeError):
                        _warn_once(path, stamp, "malformed row(s) skipped")
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        _warn_once(path, stamp, f"unreadable ({type(e).__name__})")
        rows = []
    _CACHE[str(path)] = (stamp, rows)
    return rows


def lookup(device_name, units, dtype, head_dim, batch, seqlen_k, kv_heads, gqa, page_size, path=None, keys=None,
           plan_version=None, accept=None):
    """The tuned config (a new dict) for this shape and device, or None (use the heuristic). ``plan_version``: the
    kernel's PLAN_VERSION (rows of another are skipped, warned once); ``keys``: the kernel's config keys (a row naming
    another is skipped, warned once); ``accept(batch, capacity)``: whether a row's own shape may lend its config."""
    rows = load(path)
    if not rows:
        return None
    path = path or table_path()
    version = None if plan_version is None else str(plan_version)
    want_b, want_s = int(batch), bucket(seqlen_k)
    exact = (int(units or 0), norm_dtype(dtype), int(head_dim), int(kv_heads), int(gqa), int(page_size or 0), want_s,
             bucket(want_b))
    best, best_score, stale, alien = None, None, set(), set()
    for i, r in enumerate(rows):
        if (r.units, r.dtype, r.head_dim, r.kv_heads, r.gqa, r.page_size, r.seqlen_bucket, bucket(r.batch)) != exact \
                or not device_matches(r.device, device_name):
            continue
        if r.plan_version != version:
            stale.add(r.plan_version)
            continue
        if keys is not None and not set(r.config) <= set(keys):
            alien.update(set(r.config) - set(keys))
            continue
        if accept is not None and not accept(r.batch, r.capacity):
            continue
        score = (round(abs(math.log2(r.batch / want_b)), 9), r.batch, -i)
        if best_score is None or score < best_score:
            best, best_score = r.config, score
    if stale:
        _warn_once(path, None, f"rows of plan version {', '.join(sorted(str(v) for v in stale))} skipped (this "
                               f"kernel's is {version}): measured on another plan rule, re-tune them")
    if alien:
        _warn_once(path, None, f"config keys {sorted(alien)} unknown to this kernel")
    return dict(best) if best is not None else None


def lookup_for(q, k_cache, block_table=None, path=None, keys=None, device=None, plan_version=None, accept=None):
    """lookup() with every key taken from run()'s arguments: device, units, dtype, shape, page size.
    ``device`` (name, units): the device to look up instead of q's (a plan resolved for a device profile).

    seqlen_k is the cache capacity (max_pages * page_size when paged), the same number the
    kernel's split heuristic uses."""
    import torch

    B, _, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    paged = block_table is not None
    page = int(k_cache.shape[1]) if paged else 0
    seqlen = int(block_table.shape[1]) * page if paged else int(k_cache.shape[1])
    if device is not None:
        name, units = device
    elif q.is_cuda:
        idx = q.device.index if q.device.index is not None else torch.cuda.current_device()
        name = torch.cuda.get_device_name(idx)
        units = torch.cuda.get_device_properties(idx).multi_processor_count
    else:
        name, units = q.device.type, os.cpu_count() or 0
    return lookup(name, units, norm_dtype(q.dtype), D, B, seqlen, Hkv, Hq // max(Hkv, 1), page, path=path, keys=keys,
                  plan_version=plan_version, accept=accept)
