"""Sets of files as deltas of each other, exact to the byte: a trajectory snapshot stores what changed since the
snapshot before it (kopt.store.trajectory), not another copy of solution/.

A file set maps a relative path (posix) to (bytes, permission bits). A delta is JSON-ready:
`{"files": {path: null | {"mode": m, "ops": [[i1, i2, [line, ...]], ...]} | {"mode": m, "text": s}
| {"mode": m, "b64": s}}}`: null deletes; `ops` replace lines i1:i2 of the old text (lines split after each
newline, so the bytes join back exactly); `text` / `b64` give a new or binary file whole. Unchanged files
are not named.
"""

from __future__ import annotations

import base64
import difflib
import hashlib
import os
from pathlib import Path
from typing import Optional

#: relative path -> (content, permission bits)
Files = dict[str, tuple[bytes, int]]


def read_tree(root: Path, names: list[str]) -> Files:
    """The files `names` (paths relative to root) with their bytes and permission bits."""
    out = {}
    for rel in names:
        p = Path(root) / rel
        out[rel] = (p.read_bytes(), p.stat().st_mode & 0o777)
    return out


def write_tree(root: Path, files: Files) -> None:
    """Write a file set under root (folders made as needed), each file with its bytes and permission bits."""
    for rel, (data, mode) in sorted(files.items()):
        p = Path(root) / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        os.chmod(p, mode)


def manifest(files: Files) -> dict[str, str]:
    """path -> sha256 of its bytes, sorted by path: what a restored set is checked against."""
    return {rel: hashlib.sha256(files[rel][0]).hexdigest() for rel in sorted(files)}


def _lines(text: str) -> list[str]:
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _text(data: bytes) -> Optional[str]:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _whole(data: bytes, mode: int) -> dict:
    text = _text(data)
    return {"mode": mode, "text": text} if text is not None else {"mode": mode, "b64": base64.b64encode(data).decode()}


def diff(old: Files, new: Files) -> dict:
    """The delta that turns `old` into `new`."""
    out: dict = {}
    for rel in sorted(set(old) | set(new)):
        if rel not in new:
            out[rel] = None
            continue
        data, mode = new[rel]
        if rel in old and old[rel] == new[rel]:
            continue
        a, b = (_text(old[rel][0]) if rel in old else None), _text(data)
        if a is None or b is None:
            out[rel] = _whole(data, mode)
            continue
        la, lb = _lines(a), _lines(b)
        ops = [[i1, i2, lb[j1:j2]] for tag, i1, i2, j1, j2 in
               difflib.SequenceMatcher(None, la, lb, autojunk=False).get_opcodes() if tag != "equal"]
        out[rel] = {"mode": mode, "ops": ops}
    return {"files": out}


def apply(old: Files, delta: dict) -> Files:
    """`old` with `delta` applied (ValueError when the delta does not fit it)."""
    new = dict(old)
    for rel, d in delta["files"].items():
        if d is None:
            new.pop(rel, None)
        elif "text" in d:
            new[rel] = (d["text"].encode("utf-8"), d["mode"])
        elif "b64" in d:
            new[rel] = (base64.b64decode(d["b64"]), d["mode"])
        else:
            if rel not in old or (a := _text(old[rel][0])) is None:
                raise ValueError(f"{rel}: a line delta for a file the base does not hold as text")
            la, out, at = _lines(a), [], 0
            for i1, i2, lines in d["ops"]:
                if not at <= i1 <= i2 <= len(la):
                    raise ValueError(f"{rel}: a line delta out of the base's {len(la)} lines")
                out += la[at:i1] + lines
                at = i2
            new[rel] = ("".join(out + la[at:]).encode("utf-8"), d["mode"])
    return new
