"""Tune a candidate's configs per shape: screen them, pair the fastest with the default, keep a proven winner.

- `api`    : `tune`, the call behind `kopt tune`: shards on an executor, the winner per case, the rows.
- `shard`  : one shard in the head or on a worker: prewarm children, the timing child (rerun past
             crashes), the parent's output check (kopt.eval.checks).
- `worker` : the tuning child (`python -m kopt.tune.worker`): each config through a candidate session
             (kopt.eval.session), then the finalists paired with the default.
- `pick`   : the pure selection rule: which configs are tried, paired, and which one wins.
- `models` : the job a tuning child reads and what it reports.

The tuning table itself, results/<backend>/tuning.csv, is kopt.store.tuning.
"""

from kopt.tune.api import CaseTune, TuneOptions, finish_case, ledger_row, table_row, tune

__all__ = ["CaseTune", "TuneOptions", "finish_case", "ledger_row", "table_row", "tune"]
