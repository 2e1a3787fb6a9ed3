"""kopt.timing."""

from kopt.timing.api import (  # noqa: F401
    CALL_RANGE,
    LOW_CLOCK_FRAC,
    MAX_BATCH,
    MAX_MISSING,
    TimingOptions,
    PairTiming,
    Samples,
    summarize,
    rotating,
    time_fn,
    time_pair,
)
