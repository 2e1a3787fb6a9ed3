"""The workspace's record of the loop: what was tried, what it scored, what git holds.

- `ledger`     : all JSONL I/O (candidates.jsonl and its archived generations): whole-line appends under a
                 lock, tolerant loads, `kopt import` (another copy's rows it lacks, by row id), compaction.
- `lean`       : the ledger's lean line format: a run's shared fields once, each row only its own.
- `ranking`    : candidates ranked over the ledger; the raw-row helpers (candidate id, speedup, geomeans).
- `journal`    : ITERATIONS.md as a document: parse, render, append an entry.
- `log`        : `kopt log`: the next entry, built from git (Changes) and the latest verdict (Bench).
- `iterations` : the committed iterations judged by the improvement rule; the trajectory the views draw.
- `status`     : `kopt status`: where the loop stands, the best candidate and why, stagnation.
- `vcs`        : git (GitPython, lazily): iteration numbers, `[iter N]` commits, `kopt revert`.
- `trajectory` : trajectory/ snapshots: the iteration's files whole or as a delta, restored byte for byte.
- `delta`      : file sets as line deltas of each other, exact to the byte.
- `compact`    : `kopt compact`: the ledger and the trajectory stored lean; `pack`: what travels to a GPU host.
- `commit`     : `kopt commit`: snapshot, the committed views regenerated (kopt.report), `[iter N]`.
- `scaffold`   : `kopt init`: a new workspace from the workspace template (kopt.template).
"""
