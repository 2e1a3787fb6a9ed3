"""kopt.executor."""

from kopt.executor.base import (  # noqa: F401
    EXECUTORS,
    Executor,
    LocalExecutor,
    make,
    compile_jobs,
    verify_row,
    run_verdict,
    verdict_on,
)
