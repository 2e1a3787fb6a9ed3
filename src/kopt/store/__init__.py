"""What the loop keeps on disk, read and written: I/O only, no judgement (the rules over it are kopt.policy's).

- `ledger`     : all JSONL I/O (candidates.jsonl and its archived generations): whole-line appends under a
                 lock, tolerant loads, `kopt import` (another copy's rows it lacks, by row id), compaction.
- `lean`       : the ledger's lean line format: a run's shared fields once, each row only its own.
- `journal`    : ITERATIONS.md as a document: parse, render, append an entry.
- `vcs`        : git (GitPython, lazily): iteration numbers, `[iter N]` commits, a candidate from git.
- `trajectory` : trajectory/ snapshots: the iteration's files whole or as a delta, restored byte for byte.
- `delta`      : file sets as line deltas of each other, exact to the byte.
- `calibration`: results/calibration-<device>.json: the device's A/A spread (`kopt calibrate`).
- `tuning`     : the tuning table, results/<backend>/tuning.csv: schema, tolerant read, upsert, lookup.
"""
