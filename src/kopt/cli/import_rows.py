"""`kopt import PATH`: the rows of another copy of the ledger (a device run's) appended to this workspace's."""

from __future__ import annotations

from pathlib import Path

import typer


def command(
    path: Path = typer.Argument(..., help="A candidates.jsonl, or an archive holding one (a campaign's .tgz)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would be appended; write nothing."),
) -> None:
    """Append the rows of another ledger copy that this one does not hold (by row_id), in their order; from a
    campaign archive also its results/ files this workspace lacks (never overwriting one; views are made here)."""
    import sys
    from collections import Counter

    from kopt.errors import UsageError
    from kopt.paths import ledger_file, workspace
    from kopt.records import CaseResult
    from kopt.store import copy_results, ledger

    dest = ledger_file(workspace())
    if path.is_dir():
        raise UsageError(f"{path} is a folder: give a candidates.jsonl or a campaign archive")
    res = ledger.import_rows(CaseResult, dest, path, dry_run=dry_run)
    if not (res.added or res.present or res.skipped):  # nothing was written: an empty file is not a ledger copy
        raise UsageError(f"{res.source}: no ledger rows in it (an empty file)")
    runs = Counter((r.run_id or "NA", r.mode, r.candidate_id or "NA") for r in res.added)
    for (run, mode, cid), n in runs.items():
        print(f"  run {run} {mode} candidate {cid}: {n} row(s)")
    for no, why in res.skipped[:5]:  # refusals are warnings: stderr, as every other one
        print(f"kopt: warning: line {no} refused: {why}", file=sys.stderr)
    if len(res.skipped) > 5:
        print(f"kopt: warning: ... {len(res.skipped) - 5} more line(s) refused", file=sys.stderr)
    verb = "would append" if dry_run else "appended"
    print(f"{verb} {len(res.added)} row(s) to {dest.name} from {res.source} "
          f"({res.present} already there, {len(res.skipped)} refused)")
    files = copy_results(path, dest.parent, dry_run=dry_run)
    for name in files.written:
        print(f"  {'would write' if dry_run else 'wrote'} {name}")
    for name in files.differ:
        print(f"kopt: warning: {name} differs from the archive's copy; left as is", file=sys.stderr)
    if files.written or files.differ or files.same:
        print(f"results/: {len(files.written)} file(s) {'to write' if dry_run else 'written'}, {files.same} already "
              f"the same, {len(files.differ)} left as is (they differ); `kopt plot` and `kopt report` remake the "
              "views")
