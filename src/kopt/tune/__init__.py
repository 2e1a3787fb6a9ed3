"""kopt.tune."""

from kopt.tune.api import (  # noqa: F401
    TuneOptions,
    CaseTune,
    tune,
    finish_case,
    table_row,
    ledger_row,
)
