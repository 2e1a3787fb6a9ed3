"""The workspace's record of the loop: what was tried, what it scored, what git holds.

- `ledger`     : all JSONL I/O (candidates.jsonl): whole-line appends under a lock, tolerant loads, and
                 `kopt import` (another copy's rows it lacks, by row id).
- `ranking`    : candidates ranked over the ledger; the raw-row helpers (candidate id, speedup, geomeans).
- `journal`    : ITERATIONS.md as a document: parse, render, append an entry.
- `log`        : `kopt log`: the next entry, built from git (Changes) and the latest verdict (Bench).
- `iterations` : the committed iterations judged by the improvement rule; the trajectory the views draw.
- `status`     : `kopt status`: where the loop stands, the best candidate and why, stagnation.
- `vcs`        : git (GitPython, lazily): iteration numbers, trajectory snapshots, `kopt revert`.
- `commit`     : `kopt commit`: snapshot, the committed views regenerated (kopt.report), `[iter N]`.
- `scaffold`   : `kopt init`: a new workspace from the package templates.
"""
