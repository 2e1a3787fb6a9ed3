"""What the campaign shows: the HTML report, the plots, the peer panel (which candidate they show: kopt.policy.shown).

- `campaign` : what the plots and the report show, read once (the shown candidate per case, peers).
- `page`     : `kopt report`: one self-contained HTML page; `refresh` regenerates the committed views.
- `plot`     : `kopt plot`: the PNG figures.
- `panel`    : the peer panel (rows of `kopt peers`): table, CSV, markdown, plot.
- `browser`  : headless Chromium: a screenshot of the page, and its DOM after its scripts ran.
"""

from kopt.report.page import MEASURED, build, latest_summary, refresh, refresh_for_commit

__all__ = ["MEASURED", "build", "latest_summary", "refresh", "refresh_for_commit"]
