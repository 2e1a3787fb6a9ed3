"""`kopt lab export`: the ledger's rows of one or more `kopt bench` runs as the committed bench CSV, or as the README
table.

One CSV row per case row, in ledger order: device, date, commit, candidate id, case, its group (uniform, ragged,
seed, heldout; heldout-reigning for the reigning candidate timed on a verdict's draws), model and shape, variant,
runtime, FA2 (or named baseline) runtime, speedup with its 95% CI, GB/s, % of the read ceiling, the limit and % of
it, the eager figures, the noisy flag, timing method, how the device-only calls ran (replay: graph | stream), cold
flush kind, samples, the CUDA-event cross-check and the mean SM clock. Values not measured are written NA.

The markdown: one line per case of the contiguous fp16 rows (runtime, baseline, speedup with its CI, % of limit)
and, for each page size the runs hold, that layout's runtime against the same case's contiguous one; then one line
per page size with the ragged cases over PAGED_BAR (5%), or that none is.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from pathlib import Path

from kopt.cases import load_cases, select
from kopt.errors import UsageError
from kopt.policy import ranking
from kopt.records import fmt_na
from kopt.store import ledger

COLUMNS = ["device", "date", "commit", "candidate_id", "case", "group", "model", "shape", "variant", "runtime_ms",
           "ref_runtime_ms", "ref",
           "speedup", "speedup_ci_lo", "speedup_ci_hi", "gbps", "pct_peak", "limit_ms", "pct_limit", "eager_ms",
           "ref_eager_ms", "noisy", "method", "replay", "flush", "samples",
           "events_median_ms", "mean_clock_mhz", "status", "correct", "compile_s", "heldout_seed", "run_id"]


def rows_for(ledger_path: Path, run_ids: list[str], warn: Callable[[str], None] = print) -> list[dict]:
    """The case rows of these runs (a run id's prefix is enough), read with kopt's ledger loader (a torn line is
    passed to `warn` and skipped). A run id with no case row, or no ledger, is a usage error."""
    if not Path(ledger_path).is_file():
        raise UsageError(f"ledger not found: {ledger_path}")
    loaded = ledger.load_dicts(Path(ledger_path))
    for n, why in loaded.skipped:
        warn(f"{ledger_path}:{n}: {why}, skipped")
    rows = [r for r in loaded.rows if r.get("kind", "case") == "case"
            and any((r.get("run_id") or "").startswith(p) for p in run_ids)]
    missing = [p for p in run_ids if not any((r.get("run_id") or "").startswith(p) for r in rows)]
    if missing:
        raise UsageError(f"no case rows for run id(s) {', '.join(missing)} (`kopt candidates --json` lists runs)")
    return rows


def to_csv(rows: list[dict]) -> str:
    """The rows as the committed bench CSV (COLUMNS; NA where a value was not measured)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for r in rows:
        t = r.get("timing") or {}
        ci = r.get("speedup_ci") or [None, None]
        w.writerow([r.get("device") or "NA", (r.get("timestamp") or "NA")[:10], r.get("commit") or "NA",
                    r.get("candidate_id") or "NA", r.get("case"),
                    "heldout-reigning" if r.get("mode") == "heldout" else ranking.group_of(r), r.get("model") or "NA",
                    r.get("shape") or "NA", r.get("variant") or "NA",
                    fmt_na(r.get("runtime_ms"), "{:.6f}"), fmt_na(r.get("ref_runtime_ms"), "{:.6f}"),
                    r.get("ref") or "NA",
                    fmt_na(r.get("speedup"), "{:.4f}"), fmt_na(ci[0], "{:.4f}"), fmt_na(ci[1], "{:.4f}"),
                    fmt_na(r.get("gbps"), "{:.1f}"),
                    fmt_na(r.get("pct_peak"), "{:.1f}"), fmt_na(r.get("limit_ms"), "{:.6f}"),
                    fmt_na(r.get("pct_limit"), "{:.1f}"), fmt_na(r.get("eager_ms"), "{:.6f}"),
                    fmt_na(r.get("ref_eager_ms"), "{:.6f}"), "NA" if t.get("noisy") is None else int(bool(t["noisy"])),
                    t.get("method") or "NA", t.get("replay") or "NA", t.get("flush_kind") or "NA", t.get("n", "NA"),
                    fmt_na(t.get("events_median_ms"), "{:.6f}"),
                    fmt_na(t.get("mean_clock_mhz"), "{:.1f}"), r.get("status") or "NA", r.get("correct"),
                    fmt_na(r.get("compile_s"), "{:.2f}"), fmt_na(r.get("heldout_seed"), "{}"), r.get("run_id")])
    return buf.getvalue()


#: the paged bar: a ragged case in pages within this fraction of its contiguous runtime
PAGED_BAR = 0.05
CONTIG = "fp16-d128-contig-full"


def ragged_names() -> dict[int, str]:
    """R1, R2, ... for the case file's ragged cases, in their order there (the names the issue and README use)."""
    return {c.id: f"R{i}" for i, c in enumerate(select(load_cases(), kind="ragged"), 1)}


def to_markdown(rows: list[dict], names: dict[int, str]) -> str:
    """The README table: each case's first contiguous fp16 row, and beside it each page size's first row of the case,
    as µs and its change over contiguous; then which ragged cases miss the paged bar in each page size. names: a
    case's name where it is not its id (ragged_names)."""
    def name(row):
        return names.get(row["case"], str(row["case"]))

    base, paged = {}, {}
    for r in rows:
        v, c = r.get("variant") or "", r.get("case")
        if r.get("runtime_ms") is None:
            continue
        if v == CONTIG:
            base.setdefault(c, r)
        elif v.startswith("fp16-d128-paged") and v.endswith("-full"):
            paged.setdefault(int(v[len("fp16-d128-paged"):-len("-full")]), {}).setdefault(c, r)
    sizes = sorted(paged)
    head = ["case", "µs", "baseline µs", "speedup (95% CI)", "% limit"] + [f"{p}-token pages µs (vs contiguous)"
                                                                          for p in sizes]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * 2 + "---|" + "---:|" * (1 + len(sizes))]
    over = {p: [] for p in sizes}
    for c in sorted(base):
        r = base[c]
        ci = r.get("speedup_ci") or [None, None]
        cells = [name(r), fmt_na(r["runtime_ms"] * 1e3, "{:.2f}"),
                 fmt_na(None if r.get("ref_runtime_ms") is None else r["ref_runtime_ms"] * 1e3, "{:.2f}"),
                 f"{fmt_na(r.get('speedup'), '{:.3f}x')} ({fmt_na(ci[0], '{:.3f}')}-{fmt_na(ci[1], '{:.3f}')})",
                 fmt_na(r.get("pct_limit"), "{:.1f}")]
        for p in sizes:
            q = paged[p].get(c)
            if q is None:
                cells.append("")
                continue
            d = q["runtime_ms"] / r["runtime_ms"] - 1
            cells.append(f"{q['runtime_ms'] * 1e3:.2f} ({100 * d:+.1f}%)")
            if ranking.is_ragged(r) and d > PAGED_BAR:
                over[p].append(f"{name(r)} {100 * d:+.1f}%")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for p in sizes:
        ragged = [c for c in paged[p] if c in base and ranking.is_ragged(base[c])]
        if not ragged:
            lines.append(f"{p}-token pages: no ragged case with a contiguous row: NA")
        elif over[p]:
            lines.append(f"{p}-token pages: over the {100 * PAGED_BAR:.0f}% bar: {', '.join(over[p])}")
        else:
            lines.append(f"{p}-token pages: every ragged case ({len(ragged)}) within {100 * PAGED_BAR:.0f}% of "
                         "contiguous")
    return "\n".join(lines) + "\n"
