"""How well separate `kopt bench --all` invocations agree: per case, each run against the median of all.

    python3 scripts/bench_repeat_check.py --candidate ID [--runs N] [--out results/bench-repeat-H200.md]

Takes the last N signal runs of a candidate in the ledger (contiguous fp16 rows, the case's own lengths),
and for RUNTIME and REF_RUNTIME prints each case's median over the runs and the largest deviation from
it; a case passes when every run is within 2% or 0.2 µs of the median, whichever is larger.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
from kopt.cases import load_cases  # noqa: E402
from kopt.paths import cases_file  # noqa: E402
from kopt.workspace.ledger import load_dicts  # noqa: E402
from kopt.workspace.ranking import row_cid  # noqa: E402


def within(x: float, med: float) -> bool:
    """Within 2% or 0.2 µs of the median (ms inputs)."""
    return abs(x - med) <= max(0.02 * med, 0.2e-3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidate", required=True, help="candidate id (12 hex digits)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--ledger", type=Path, default=Path("candidates.jsonl"))
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    by_run: dict[str, dict[int, dict]] = defaultdict(dict)
    order: list[str] = []
    labels = {c.id: c.variant.label() for c in load_cases(cases_file(REPO))}  # each case as the table defines it
    for r in load_dicts(a.ledger).rows:  # kopt's tolerant reader (torn lines skipped)
        if r.get("mode") != "signal" or row_cid(r) != a.candidate or not r.get("runtime_ms") \
                or r.get("variant") != labels.get(r.get("case")):
            continue
        if r["run_id"] not in by_run:
            order.append(r["run_id"])
        by_run[r["run_id"]][r["case"]] = r
    runs = [x for x in order if len(by_run[x]) >= len(labels)][-a.runs:]
    if len(runs) < a.runs:
        print(f"only {len(runs)} complete runs of {a.candidate} in {a.ledger}", file=sys.stderr)
        return 2
    lines = [f"# {len(runs)} separate `kopt bench --all --cold-cache` runs of candidate {a.candidate}", "",
             "Runs: " + ", ".join(f"`{x}` ({by_run[x][1].get('commit')}, {by_run[x][1]['timestamp'][:16]})"
                                   for x in runs), "",
             "Per case: median over the runs (µs) and the largest deviation of one run from it; pass = every run "
             "within ±2% or ±0.2 µs of the median.", "",
             "| case | RUNTIME median | max dev | REF_RUNTIME median | max dev | pass |", "|---|---|---|---|---|---|"]
    worst = (0.0, 0, "")
    fails = 0
    for case in sorted(by_run[runs[0]]):
        cells, ok = [], True
        for key, who in (("runtime_ms", "candidate"), ("ref_runtime_ms", "FA2")):
            xs = [by_run[x][case][key] for x in runs if by_run[x].get(case, {}).get(key)]
            med = statistics.median(xs)
            dev = max(abs(x - med) for x in xs)
            ok = ok and all(within(x, med) for x in xs)
            if dev / med > worst[0]:
                worst = (dev / med, case, who)
            cells += [f"{med * 1e3:.2f}", f"{100 * dev / med:.2f}% ({dev * 1e3:.2f} µs)"]
        fails += not ok
        lines.append(f"| {case} | " + " | ".join(cells) + f" | {'yes' if ok else 'no'} |")
    lines += ["", f"Worst: case {worst[1]} ({worst[2]}), {100 * worst[0]:.2f}% from its median; "
                  f"{fails} case(s) outside the bound."]
    text = "\n".join(lines) + "\n"
    if a.out:
        a.out.write_text(text)
    print(text)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
