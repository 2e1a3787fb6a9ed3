"""kopt.report."""

from kopt.report.page import (  # noqa: F401
    MEASURED,
    latest_summary,
    build,
    refresh,
    refresh_for_commit,
)
