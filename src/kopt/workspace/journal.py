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
from typing import Callable, Optional

from pydantic import BaseModel, Field, field_validator

from kopt.errors import UsageError, WorkspaceError
from kopt.records import fmt_na

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


# ------------------------------------------------------------------ building an entry

def changes_section(ws: Path) -> str:
    """`git diff --stat` of the workspace paths (HEAD vs working tree) plus untracked files."""
    from kopt.workspace import vcs

    stat = vcs.diff_stat(ws)
    if stat is None:
        return "_(not a git repository: no diff; run `kopt init`)_"
    return f"```\n{stat}\n```" if stat else "_(no changes in the workspace paths since HEAD)_"


def bench_section(ws: Path) -> str:
    """Per-case table of the latest verdict (% of the roofline limit beside the speedup), plus its uniform
    and ragged geomeans judged against the previous best iteration (kopt.workspace.status.judge)."""
    from kopt.workspace import status as loop, ranking
    from kopt.workspace.ledger import load_dicts
    from kopt.paths import ledger_file

    cid = loop.current_candidate(ws)
    rows = load_dicts(ledger_file(ws)).rows
    latest = ranking.latest_verdict(rows, cid) or ranking.latest_verdict(rows)
    if not latest:
        return f"_(no verdict rows in candidates.jsonl for candidate `{cid or 'NA'}`: run `kopt verify` first)_"
    got = ranking.row_cid(latest[0])
    out = ["| case | runtime ms | ref ms | speedup | % limit | noisy | status |", "|---:|---:|---:|---:|---:|---|---|"]
    noisy_cases = []
    for r in latest:
        case = " ".join(str(x) for x in (r.get("case"), "ragged" if ranking.is_ragged(r) else "", r.get("variant")) if x)
        s = ranking.row_speedup(r)
        noisy = noisy_sides(r)
        if noisy:
            noisy_cases.append(f"{r.get('case')} ({noisy})")
        out.append(f"| {case} | {fmt_na(r.get('runtime_ms'))} | {fmt_na(r.get('ref_runtime_ms'))} | "
                   f"{fmt_na(s or None, '{:.3f}x')} | {fmt_na(r.get('pct_limit'), '{:.1f}')} | {noisy} | "
                   f"{r.get('status', 'NA')} |")
    g = ranking.geomeans(latest)
    gm = g.uniform
    where = sorted({f"{r['device']} vs {r.get('ref') or 'NA'}" for r in latest if r.get("device") not in (None, "NA")})
    line = (f"Candidate `{got}`{' on ' + ', '.join(where) if where else ''}: geomean speedup {fmt_na(gm, '{:.3f}')}x "
            f"over {g.n_uniform} correct case(s)")
    if g.n_ragged:
        line += f", ragged {fmt_na(g.ragged, '{:.3f}')}x over {g.n_ragged}"
    if g.pct_limit is not None or g.pct_limit_ragged is not None:
        line += f"; % of limit {fmt_na(g.pct_limit, '{:.1f}')} (ragged {fmt_na(g.pct_limit_ragged, '{:.1f}')})"
    if cid and got != cid:
        line += f" (the current solution is `{cid}`, which has no verdict yet)"
    dev = ranking.verdict_device(latest)
    hist = [it for it in loop.history(ws, rows) if it.candidate_id != got or it.device != dev]  # not its own
    best = loop.best_iteration(hist, dev)
    if best is None or best.geomean is None:
        line += f"; no previous best iteration on {dev or 'this device'}."
    elif gm is not None:
        thr = loop.threshold(ws, dev, rows)
        j = loop.judge(gm, g.ragged, False, best.geomean, best.geomean_ragged, thr)
        prev = f"{best.geomean:.3f}x" + (f" (ragged {best.geomean_ragged:.3f}x)" if best.geomean_ragged else "")
        line += (f"; previous best {prev} (iter {best.iteration}, `{best.candidate_id}`): "
                 f"{j.reason} -> {j.outcome} (threshold +{thr * 100:.1f}%).")
    else:
        line += f"; previous best {best.geomean:.3f}x (iter {best.iteration}) -> failed (no correct case)."
    if noisy_cases:
        line += (f"\n\nNoisy timing (interquartile range over the noise limit) on case {', '.join(noisy_cases)}: "
                 "those speedups can move between runs by more than the A/A spread.")
    return "\n".join(out) + "\n\n" + line


def noisy_sides(row: dict) -> str:
    """Which timings of a row were flagged noisy: 'candidate', 'ref', 'both' or ''."""
    cand = bool((row.get("timing") or {}).get("noisy"))
    ref = bool((row.get("ref_timing") or {}).get("noisy"))
    return {(True, True): "both", (True, False): "candidate", (False, True): "ref"}.get((cand, ref), "")


def _title(title: Optional[str], hypothesis: Optional[str], number: int) -> str:
    if title:
        return " ".join(title.split())
    first = (hypothesis or "").strip().split("\n")[0]
    return (first[:57] + "...") if len(first) > 60 else (first or f"iteration {number}")


def log_iteration(ws: Path, title: Optional[str] = None, hypothesis: Optional[str] = None,
                  analysis: Optional[str] = None, next_: Optional[str] = None, replace: bool = False,
                  edit: Optional[Callable[[str], Optional[str]]] = None) -> Entry:
    """Build the next entry (Changes from git, Bench from the ledger) and append it to ITERATIONS.md."""
    from kopt.workspace import vcs

    path = journal_file(ws)
    _, doc = read(path)
    last = doc.entries[-1].number if doc.entries else 0
    number = vcs.next_iteration(ws, fallback=last + 1)
    pending = bool(doc.entries) and last == number
    if last > number:
        raise WorkspaceError(f"ITERATIONS.md ends at iteration {last} but git has only {number - 1} [iter] "
                             f"commit(s): commit it (`kopt commit`) or fix ITERATIONS.md")
    if pending and not replace:
        raise WorkspaceError(f"iteration {number} is already logged and not committed yet: "
                             f"commit it (`kopt commit -m ...`) or re-log with --replace")
    entry = Entry(number=number, title=_title(title, hypothesis, number), sections={
        "Hypothesis": hypothesis or "", "Changes": changes_section(ws), "Bench": bench_section(ws),
        "Analysis": analysis or "", "Next": next_ or ""})
    if edit is not None:
        edited = edit(render_entry(entry))
        if edited is None:
            raise UsageError("log aborted: the editor closed without saving")
        got = parse(edited)
        if len(got) != 1:
            raise UsageError("log aborted: the edited text must hold exactly one '## Iteration N' entry")
        entry = Entry(number=number, title=got[0].title or entry.title, sections=got[0].sections)
    add_entry(path, entry, replace=pending)
    return entry
