"""Reading SASS as ncu's source page prints it (`kopt profile --source`): the most sampled instructions of each
kernel and, for each, what it waits on.

The page (`ncu --import R --page source --csv --print-source sass`) holds one block a kernel: a "Kernel Name" row, a
header ("Address", "Source", "Warp Stall Sampling (All Samples)", ..., one `stall_<reason>` column a reason), one row
an instruction in address order. A stall is sampled on the instruction that waits, not on the load it waits for;
`waits_on` reads the dependence back from the SASS: a barrier or scoreboard wait right before it (DEPBAR waits for
cp.async groups), else the nearest earlier writer of a register it reads, in program order (inside a loop that may be
the previous iteration's). Register widths come from the operand (R4.64) or the opcode (LDG.E.64, LDS.128) only.
"""

from __future__ import annotations

import csv
import io
import re
from typing import Optional

from kopt.profile.common import ProfileError, number
from kopt.profile.models import HotInstruction

#: Instructions summary.md lists from the source page, the most sampled first.
HOT_TOP = 16


def _count(text: str) -> int:
    return int(number(text) or 0)


_SAMPLES = "Warp Stall Sampling (All Samples)"


def parse_source(text: str, top: int = HOT_TOP) -> tuple[list[HotInstruction], dict[str, int]]:
    """The source page (`--page source --csv --print-source sass`, one block a kernel: a "Kernel Name" row, a
    header, one row an instruction) as the ``top`` most sampled instructions over all kernels, and each kernel's
    sample total. Offsets count from the kernel's first instruction; a page without the samples column is a
    ProfileError."""
    hot, totals = [], {}
    for block in _source_blocks(text):
        kernel, head, rows = block
        if _SAMPLES not in head or "Address" not in head:
            raise ProfileError(f"ncu source page has no {_SAMPLES!r} column (SourceCounters not collected?)")
        ix = {h: i for i, h in enumerate(head)}
        stall_cols = [h for h in head if h.startswith("stall_") and not h.endswith("(Not Issued)")]
        rows = [r for r in rows if len(r) == len(head)]
        if not rows:
            continue
        base = int(rows[0][ix["Address"]], 16)
        total = sum(_count(r[ix[_SAMPLES]]) for r in rows)
        totals[kernel] = totals.get(kernel, 0) + total
        sass = [" ".join(r[ix["Source"]].split()) for r in rows]
        for at, r in enumerate(rows):
            n = _count(r[ix[_SAMPLES]])
            if n:
                stalls = {c[len("stall_"):]: _count(r[ix[c]]) for c in stall_cols}
                w = waits_on(sass, at)
                hot.append(HotInstruction(kernel=kernel, offset=int(r[ix["Address"]], 16) - base,
                                          waits_on=f"0x{int(rows[w][ix['Address']], 16) - base:04x} {sass[w]}"
                                          if w is not None else "",
                                          sass=sass[at], samples=n,
                                          share_pct=round(100.0 * n / total, 1),
                                          stalls=dict(sorted(((k, v) for k, v in stalls.items() if v),
                                                             key=lambda kv: -kv[1]))))
    if not totals:
        raise ProfileError('ncu source page has no "Kernel Name" block with instructions')
    hot.sort(key=lambda h: -h.samples)
    return hot[:top], totals


_WAIT_OPS = ("DEPBAR", "BAR", "WARPSYNC", "MEMBAR", "SYNCS")
#: How far back a register's writer is looked for (instructions).
WRITER_WINDOW = 256


def waits_on(sass: list[str], at: int) -> Optional[int]:
    """Index of what instruction ``at`` waits behind: the barrier or scoreboard wait right before it, else the
    nearest earlier instruction (at most WRITER_WINDOW back, in program order) writing a register it reads; None
    when neither is found."""
    if at > 0 and _opcode(sass[at - 1]).startswith(_WAIT_OPS):
        return at - 1
    reads = _registers(_operands(sass[at])[_first_read(sass[at]):])
    if not reads:
        return None
    for j in range(at - 1, max(-1, at - 1 - WRITER_WINDOW), -1):
        ops = _operands(sass[j])
        if ops and _written(sass[j], ops) & reads:
            return j
    return None


def _opcode(ins: str) -> str:
    words = ins.split()
    return (words[1] if words and words[0].startswith("@") else words[0] if words else "").upper()


def _operands(ins: str) -> list[str]:
    words = ins.split(None, 2 if ins.startswith("@") else 1)
    rest = words[-1] if len(words) > (2 if ins.startswith("@") else 1) else ""
    return [o.strip() for o in rest.split(",") if o.strip()]


def _first_read(ins: str) -> int:
    """Operands before this index are written: the first one (SHFL: a predicate and a register), except for stores,
    async copies, branches and barriers, which write no register."""
    op = _opcode(ins)
    if op.startswith("SHFL"):
        return 2
    return 0 if op.startswith(("ST", "RED", "LDGSTS", "BRA", "BAR", "DEPBAR", "EXIT", "RET", "CALL", "SYNCS",
                               "WARPSYNC", "MEMBAR", "NOP", "LDGDEPBAR", "ARRIVES", "JMP")) else 1


def _written(ins: str, ops: list[str]) -> set[int]:
    """Registers an instruction writes: its written operands, widened by the opcode's size (LDG.E.64 R4 writes R4
    and R5; LDS.128 R8 writes R8-R11)."""
    regs = _registers(ops[:_first_read(ins)])
    width = next((w for s, w in ((".128", 4), (".64", 2)) if s in _opcode(ins)), 1)
    return {r + k for r in regs for k in range(width)} if len(regs) == 1 else regs


def _registers(ops: list[str]) -> set[int]:
    """General registers an operand list names (R4.64 names R4 and R5; RZ none)."""
    regs = set()
    for o in ops:
        for m in re.finditer(r"(?<![A-Za-z0-9_])R(\d+)(\.64|\.128)?", o):
            r, width = int(m.group(1)), {".64": 2, ".128": 4}.get(m.group(2) or "", 1)
            regs.update(range(r, r + width))
    return regs


def _source_blocks(text: str):
    kernel, head, rows = None, None, []
    for r in csv.reader(io.StringIO(text)):
        if r[:1] == ["Kernel Name"]:
            if kernel is not None and head:
                yield kernel, head, rows
            kernel, head, rows = (r[1] if len(r) > 1 else "?"), None, []
        elif kernel is not None and head is None:
            head = r
        elif head is not None:
            rows.append(r)
    if kernel is not None and head:
        yield kernel, head, rows
