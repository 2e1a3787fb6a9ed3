"""What the loop keeps on disk, read and written: I/O only, no judgement (the rules over it are kopt.policy's).

- `ledger`      : all JSONL I/O (candidates.jsonl and its archived generations): whole-line appends under a
                  lock, tolerant loads, `kopt import` (another copy's rows it lacks, by row id), compaction.
- `lean`        : the ledger's lean line format: a run's shared fields once, each row only its own.
- `journal`     : ITERATIONS.md as a document: parse, render, append an entry.
- `vcs`         : git (GitPython, lazily): iteration numbers, `[iter N]` commits, a candidate from git (by id, or
                  as `REV:PATH`: resolve_candidate).
- `trajectory`  : trajectory/ snapshots: the iteration's files whole or as a delta, restored byte for byte.
- `delta`       : file sets as line deltas of each other, exact to the byte.
- `calibration` : results/calibration-<device>.json: the device's A/A spread (`kopt calibrate`).
- `tuning`      : the tuning table, results/<backend>/tuning.csv: schema, tolerant read, upsert, lookup.
- `results_copy`: a campaign archive's results/ files brought in by `kopt import` (new ones only; views never).
"""

#: The face: the calls other stages make most, by the module that holds each.
_FACE = {"Loaded": "ledger", "append": "ledger", "load": "ledger", "load_dicts": "ledger",
         "candidate_hash": "vcs", "head_short": "vcs", "resolve_candidate": "vcs", "copy_results": "results_copy"}

__all__ = sorted(_FACE)


def __getattr__(name: str):
    """The public face, imported on first use: a stage that appends a row never loads git, nor the reverse."""
    if name in _FACE:
        from importlib import import_module

        return getattr(import_module(f"kopt.store.{_FACE[name]}"), name)
    raise AttributeError(f"module 'kopt.store' has no attribute {name!r}")
