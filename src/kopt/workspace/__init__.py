"""The loop's commands over the workspace: they read and write through kopt.store, judge through kopt.policy and
regenerate the views through kopt.report.

- `log`        : `kopt log`: the next entry, built from git (Changes) and the latest verdict (Bench).
- `status`     : `kopt status`: where the loop stands, the best candidate and why, stagnation.
- `commit`     : `kopt commit`: snapshot, the committed views regenerated (kopt.report), `[iter N]`;
                 `kopt compact`: the ledger and the trajectory stored lean.
- `revert`     : `kopt revert`: solution/ restored from a snapshot as a new commit, the attempt recorded first.
- `pack`       : `kopt pack`: what travels to a GPU host.
- `scaffold`   : `kopt init`: a new workspace from the workspace template (kopt.template).
"""
