"""Which configs a tuning run tries, which it pairs against the default, and which one wins.

Pure functions over ConfigResult lists (no torch), shared by the tuning child and the parent and
unit-tested on synthetic results.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from kopt.records import Status

if TYPE_CHECKING:
    from kopt.tune.models import ConfigResult

#: Largest timing CI (relative) that can make a faster config a tie with the default (unpaired rule).
NOISE_CAP = 0.05

Pick = tuple[Optional["ConfigResult"], Optional["ConfigResult"], Optional[float], str]


def select_indices(n: int, max_configs: Optional[int]) -> list[int]:
    """Config indices to try: all, or the default (0) plus K-1 others spread evenly over the rest."""
    if n <= 0:
        return []
    if not max_configs or max_configs >= n:
        return list(range(n))
    if max_configs == 1:
        return [0]
    rest, k = n - 1, max_configs - 1
    picks = sorted({1 + round(j * (rest - 1) / max(k - 1, 1)) for j in range(k)}) if k > 1 else [1]
    return [0] + picks


def shard_indices(selected: list[int], shard: int, shards: int) -> list[int]:
    """This shard's configs: the default (so each child times its own reference) plus every shards-th other."""
    if not selected:
        return []
    return [selected[0]] + selected[1:][shard::shards]


def _screened(r: ConfigResult) -> bool:
    return r.status == Status.ok and r.cold is not None


def pick_finalists(results: list[ConfigResult], n: int) -> list[int]:
    """Up to n config indices other than the default, fastest screened cold median first.

    Only configs that screened ok count, and none are picked when the default did not screen
    ok: there is nothing to pair them against.
    """
    if n <= 0 or not any(r.index == 0 and _screened(r) for r in results):
        return []
    ranked = sorted((r for r in results if r.index != 0 and _screened(r)), key=lambda r: (r.cold.median_ms, r.index))
    return [r.index for r in ranked[:n]]


def pick_winner(results: list[ConfigResult], aa_spread: Optional[float] = None) -> Pick:
    """(winner, default it is compared with, gain, note) among the correct configs.

    With paired data (the finalists' ABBA runs against their shard's default), the winner is
    the finalist with the highest paired speedup that passes `stats.is_improvement` for this
    A/A spread; if none passes, the default stays (gain 1). Without it, the unpaired rule.
    """
    ok, defaults = _correct(results)
    if not ok:
        return None, None, None, "no correct config"
    paired = _paired(ok, defaults)
    if paired:
        return _paired_winner(paired, defaults, aa_spread)
    return _unpaired_winner(ok, defaults)


def _correct(results: list[ConfigResult]) -> tuple[list[ConfigResult], dict]:
    """The correct, cold-timed configs, and each shard's default among them."""
    ok = [r for r in results if r.correct and r.cold]
    return ok, {r.shard: r for r in ok if r.index == 0}


def _paired(ok: list[ConfigResult], defaults: dict) -> list[ConfigResult]:
    """The correct finalists with paired figures against their own shard's default."""
    return [r for r in ok if r.index != 0 and r.shard in defaults and r.paired_speedup and r.paired_ci]


def _rank(r: ConfigResult) -> tuple:
    """A finalist's order: the higher paired speedup, then the lower index."""
    return r.paired_speedup, -r.index


def best_finalist(results: list[ConfigResult]) -> Optional[ConfigResult]:
    """The finalist pick_winner ranks first, whether or not it passed the improvement rule; None when none was
    paired."""
    paired = _paired(*_correct(results))
    return max(paired, key=_rank) if paired else None


def _paired_winner(paired: list[ConfigResult], defaults: dict, aa_spread: Optional[float]) -> Pick:
    from kopt.timing.stats import is_improvement

    passing = [r for r in paired if is_improvement(r.paired_speedup, r.paired_ci, aa_spread)]
    if passing:
        w = max(passing, key=_rank)
        return w, defaults[w.shard], w.paired_speedup, ""
    best = max(paired, key=_rank)
    d, (lo, hi) = defaults[best.shard], best.paired_ci
    return d, d, 1.0, (f"best finalist {best.paired_speedup:.3f}x (CI {lo:.3f}-{hi:.3f}): "
                       "not an improvement, default kept")


def _unpaired_winner(ok: list[ConfigResult], defaults: dict) -> Pick:
    """Fastest correct cold median relative to its shard's default (results without paired data).

    A winner faster than the default by less than the larger of their CI half-widths is noise:
    the default is kept (gain 1). The CI is capped at NOISE_CAP: wider than that, it says the
    timing is noisy (few host samples on a busy CPU), not that the configs tie.
    """
    relative = all(r.shard in defaults for r in ok)
    score = (lambda r: r.cold.median_ms / defaults[r.shard].cold.median_ms) if relative else \
        (lambda r: r.cold.median_ms)
    best = min(ok, key=lambda r: (score(r), r.index))
    default = defaults.get(best.shard) or next((r for r in ok if r.index == 0), None)
    if default is None:
        return best, None, None, "the default config failed"
    gain = default.cold.median_ms / best.cold.median_ms
    noise = min(NOISE_CAP, max(best.cold.ci_rel or 0.0, default.cold.ci_rel or 0.0))
    if best is not default and gain < 1.0 + noise:
        return default, default, 1.0, f"best other config within noise ({gain:.3f}x, CI {noise:.1%})"
    return best, default, gain, ""
