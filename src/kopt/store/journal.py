"""ITERATIONS.md: the loop's log, one numbered entry per iteration, parseable back by kopt.

Canonical shape (what `render` writes and `parse` reads back exactly):

    # Iterations                      <- preamble (kept byte for byte)
    ...
                                      <- one blank line before each entry
    ## Iteration N — <title>

    ### Hypothesis

    <text>

    ### Changes ... ### Bench ... ### Analysis ... ### Next

Headings inside fenced code blocks are body text. New entries are appended to the existing
text (never a re-render of the whole file), so hand edits of older entries survive.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, Field, field_validator

SECTIONS = ("Hypothesis", "Changes", "Bench", "Analysis", "Next")
PREAMBLE = ("# Iterations\n\nOne entry per optimization iteration: Profile -> Edit -> Benchmark -> Log -> Commit.\n"
            "Written by `kopt log`; `kopt commit` records entry N as the git commit `[iter N]`.")
_ENTRY_RE = re.compile(r"^## Iteration (\d+)(?:\s*[—–-]\s*(.*?))?\s*$")
_SECTION_RE = re.compile(r"^### (.+?)\s*$")


class Entry(BaseModel):
    """One iteration of ITERATIONS.md."""

    number: int = Field(ge=1)
    title: str = ""
    sections: dict[str, str] = Field(default_factory=dict)
    """Section name -> body (markdown, no leading/trailing blank lines), in file order."""

    @field_validator("sections")
    @classmethod
    def _strip(cls, v: dict[str, str]) -> dict[str, str]:
        return {k: s.strip("\n") for k, s in v.items()}


@dataclass
class Document:
    """A parsed ITERATIONS.md: the text before the first entry, the entries, each entry's first line."""

    preamble: str = PREAMBLE
    entries: list[Entry] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)


def _headings(lines: list[str], pattern: re.Pattern) -> list[tuple[int, re.Match]]:
    """(line index, match) of headings outside fenced code blocks."""
    out, fenced = [], False
    for i, line in enumerate(lines):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and (m := pattern.match(line)):
            out.append((i, m))
    return out


def parse_document(text: str) -> Document:
    """Parse ITERATIONS.md text into preamble + entries (tolerant of hand edits)."""
    lines = text.split("\n")
    heads = _headings(lines, _ENTRY_RE)
    first = heads[0][0] if heads else len(lines)
    doc = Document(preamble="\n".join(lines[:first]).rstrip("\n"))
    for k, (i, m) in enumerate(heads):
        end = heads[k + 1][0] if k + 1 < len(heads) else len(lines)
        body = lines[i + 1:end]
        secs = _headings(body, _SECTION_RE)
        sections = {}
        for j, (si, sm) in enumerate(secs):
            send = secs[j + 1][0] if j + 1 < len(secs) else len(body)
            sections[sm.group(1)] = "\n".join(body[si + 1:send])
        doc.entries.append(Entry(number=int(m.group(1)), title=(m.group(2) or "").strip(), sections=sections))
        doc.starts.append(i)
    return doc


def parse(text: str) -> list[Entry]:
    """The entries of an ITERATIONS.md text."""
    return parse_document(text).entries


def render_entry(e: Entry) -> str:
    """One entry in the canonical shape, ending with a newline."""
    head = f"## Iteration {e.number} — {e.title}" if e.title else f"## Iteration {e.number}"
    parts = [head] + [f"### {k}\n\n{v}" if v else f"### {k}" for k, v in e.sections.items()]
    return "\n\n".join(parts) + "\n"


def render(entries: list[Entry], preamble: str = PREAMBLE) -> str:
    """A whole ITERATIONS.md; render(parse(x)) == x for any x that kopt wrote."""
    return preamble.rstrip("\n") + "\n" + "".join("\n" + render_entry(e) for e in entries)


def write_atomic(path: Path, text: str) -> None:
    """Write a file so readers see the old or the new text, never half of it."""
    from kopt import atomic

    atomic.write_text(path, text)


def journal_file(ws: Path) -> Path:
    """ITERATIONS.md of a workspace."""
    return Path(ws) / "ITERATIONS.md"


def read(path: Path) -> tuple[str, Document]:
    """(text, parsed document) of ITERATIONS.md; an absent file is the empty canonical one."""
    path = Path(path)
    text = path.read_text(encoding="utf-8") if path.exists() else render([])
    return text, parse_document(text)


def add_entry(path: Path, entry: Entry, replace: bool = False) -> None:
    """Append an entry (or, with replace, swap the last entry for it) atomically."""
    text, doc = read(path)
    if replace and doc.entries:
        text = "\n".join(text.split("\n")[:doc.starts[-1]])
    write_atomic(path, text.rstrip("\n") + "\n\n" + render_entry(entry))


def entry_text(ws: Path, number: int) -> Optional[str]:
    """The rendered entry N of the workspace's ITERATIONS.md, or None."""
    _, doc = read(journal_file(ws))
    found = [e for e in doc.entries if e.number == number]
    return render_entry(found[-1]) if found else None
