"""The results/ files of a campaign archive (kopt.lab.campaign packs the device workspace's results/ beside its
ledger copy) brought into this workspace by `kopt import`: a file this workspace lacks is written, one it holds with
the same bytes is left, one it holds with other bytes is left and named (never overwritten: compare them with
`tar -xzf ARCHIVE results/...`). The views `kopt plot` and `kopt report` write from the ledger (results/STATUS.md,
report.html, plots/) are not taken: made here again from the merged ledger, they stay the ledger's."""

from __future__ import annotations

import tarfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

#: Files `kopt plot` / `kopt report` derive from the ledger (names, or a folder of them): never copied.
VIEWS = ("STATUS.md", "report.html", "plots")


@dataclass
class Copied:
    """What `copy_results` did (or, dry, would do): files written, files already the same, files that differ."""

    written: list[str] = field(default_factory=list)
    same: int = 0
    differ: list[str] = field(default_factory=list)


def _is_view(parts: tuple[str, ...]) -> bool:
    return any(p in VIEWS for p in parts[1:])


def copy_results(archive: Path, ws: Path, dry_run: bool = False) -> Copied:
    """The archive's results/ files into ws/results (the module's rules); nothing for a file that is no archive."""
    out = Copied()
    if not tarfile.is_tarfile(archive):
        return out
    with tarfile.open(archive) as tar:
        for m in tar.getmembers():
            parts = PurePosixPath(m.name).parts
            if not m.isfile() or len(parts) < 2 or parts[0] != "results" or ".." in parts or _is_view(parts):
                continue
            data = tar.extractfile(m).read()
            dest = ws.joinpath(*parts)
            if dest.is_file():
                if dest.read_bytes() == data:
                    out.same += 1
                else:
                    out.differ.append(str(PurePosixPath(*parts)))
                continue
            out.written.append(str(PurePosixPath(*parts)))
            if not dry_run:
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(data)
    return out
