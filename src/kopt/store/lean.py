"""The ledger's lean line format (schema_version 2): a run's shared fields stored once, each row only its own.

A ledger file holds JSON lines of three kinds:

- a whole row: one CaseResult as JSON (a schema 1 ledger holds only these; `ledger.append` writes these);
- a run record, `{"schema_version": 2, "run": RUN_ID, "keys": [...], "shared": {...}}`: the fields whose value
  every lean row of that run in this file shares (hypothesis, plan, versions, static warnings, device...), and
  the rows' field names in their order;
- a lean row, `{"schema_version": 2, "of": RUN_ID, "own": {...}}`: that row's other fields (its case, its
  figures, its timings).

A lean row reads back as `{k: own[k] if k in own else shared[k] for k in keys}`: the dict, key order included,
of the whole row it was encoded from; `encode` checks every row and keeps one whole where it would not. Which
fields are shared is found from the rows themselves, never from a list of field names, so a new row field
needs no change here. A run record belongs to its file: a run whose rows span two files has one in each.
Pure functions over text and dicts; the I/O is kopt.store.ledger's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Optional, Union

FORMAT = 2
RUN_KEYS = frozenset({"schema_version", "run", "keys", "shared"})
ROW_KEYS = frozenset({"schema_version", "of", "own"})


def dumps(obj) -> str:
    """One JSON line, compact, as pydantic writes rows (UTF-8 kept, no spaces)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _same(a, b) -> bool:
    """Equal as JSON (1, 1.0 and true are three values, as they are in the file)."""
    return a is b or dumps(a) == dumps(b)


def _records(rows: list[dict]) -> dict[str, tuple[list[str], dict]]:
    """run_id -> (field names in row order, shared fields) of the runs worth a record: two rows or more with the
    same field names in the same order."""
    by_run: dict[str, list[dict]] = {}
    for r in rows:
        if isinstance(r.get("run_id"), str) and r["run_id"]:
            by_run.setdefault(r["run_id"], []).append(r)
    out = {}
    for run, rs in by_run.items():
        keys = list(rs[0])
        same = [r for r in rs if list(r) == keys]
        if len(same) < 2:
            continue
        first = same[0]
        out[run] = (keys, {k: first[k] for k in keys if all(_same(r[k], first[k]) for r in same[1:])})
    return out


def encode(items: Iterable[Union[dict, str]]) -> list[str]:
    """Lines (without newlines) of a lean ledger holding `items` in order: row dicts, and lines that are no row
    (torn, not JSON) kept verbatim where they stood."""
    items = list(items)
    records = _records([r for r in items if isinstance(r, dict)])
    lines, written = [], set()
    for r in items:
        if isinstance(r, str):
            lines.append(r)
            continue
        run = r.get("run_id")
        rec = records.get(run) if isinstance(run, str) else None
        if rec is None or list(r) != rec[0]:
            lines.append(dumps(r))
            continue
        keys, shared = rec
        own = {k: v for k, v in r.items() if k not in shared or not _same(v, shared[k])}
        if len(own) == len(r):  # nothing shared with its run: whole is shorter
            lines.append(dumps(r))
            continue
        if run not in written:
            lines.append(dumps({"schema_version": FORMAT, "run": run, "keys": keys, "shared": shared}))
            written.add(run)
        lines.append(dumps({"schema_version": FORMAT, "of": run, "own": own}))
    return lines


def decode(text: str) -> Iterator[tuple[int, str, Optional[dict], str]]:
    """(line number, line, row dict or None, why not) for every non-blank line of ledger text that is not a run
    record: whole rows as written, lean rows read back whole (their line: the whole row's JSON)."""
    records: dict[str, tuple[list, dict]] = {}
    for no, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            obj = None
        if not isinstance(obj, dict):
            yield no, line, None, "torn or invalid JSON"
            continue
        if obj.get("schema_version") == FORMAT and obj.keys() == RUN_KEYS:
            records[str(obj["run"])] = (list(obj["keys"]), dict(obj["shared"]))
            continue
        if obj.get("schema_version") == FORMAT and obj.keys() == ROW_KEYS:
            rec = records.get(str(obj["of"]))
            own = obj["own"] if isinstance(obj["own"], dict) else None
            if rec is None or own is None or any(k not in own and k not in rec[1] for k in rec[0]):
                yield no, line, None, f"lean row of run {obj['of']} without its run record before it"
                continue
            row = {k: own[k] if k in own else rec[1][k] for k in rec[0]}
            yield no, dumps(row), row, ""
            continue
        yield no, line, obj, ""
