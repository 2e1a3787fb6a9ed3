"""results/STATUS.md: where the kernel stands, one short table written from the ledger and results/hardware-*.json.

The README links to it instead of quoting figures; `kopt report` and `kopt commit` write it, and a test fails when the
committed file is not what the committed ledger gives. No wall-clock time is written: the same data, the same file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

#: Where the file lives, relative to the workspace.
STATUS_REL = "results/STATUS.md"


def _x(v: Optional[float]) -> str:
    return "NA" if v is None else f"{v:.3f}x"


def _p(v: Optional[float]) -> str:
    return "NA" if v is None else f"{v:.1f}%"


def markdown(ws: Path, campaign=None) -> str:
    """The text of results/STATUS.md for the workspace (campaign: kopt.report.campaign.load_campaign when already
    read, all devices)."""
    from kopt.cases import load_cases
    from kopt.hardware import cache_file
    from kopt.paths import CANDIDATE_REL, cases_file
    from kopt.policy import ranking
    from kopt.policy.shown import ranges
    from kopt.report.campaign import load_campaign

    ws = Path(ws)
    c = campaign or load_campaign(ws)
    s = c.shown
    cases = load_cases(cases_file(ws))
    kinds: dict[str, list[int]] = {}
    for case in cases:
        kinds.setdefault(case.kind, []).append(case.id)
    lines = ["# Where the kernel stands", "",
             "Written by `kopt report` (and `kopt commit`) from `candidates.jsonl` and `results/hardware-*.json`; "
             "do not edit by hand.", ""]
    if not s or not s.candidate_id:
        return "\n".join(lines + ["No candidate rows in the ledger yet: run `kopt bench`, then `kopt verify`.", ""])
    lines += [s.headline() + ".", ""]
    rows = [r for r in c.ledger.rows if s.verdict_run and r.get("run_id") == s.verdict_run
            and r.get("mode") == "verdict" and ranking.row_cid(r) == s.candidate_id]
    g = ranking.geomeans(rows)
    where = CANDIDATE_REL if s.source == "shipped" else "no solution/ in the workspace"
    it = f"iteration {s.iteration}" if s.iteration is not None else "no iteration"
    table = [("shown candidate", f"`{s.candidate_id}` ({s.source}, {it}; {where})"),
             ("its verdict", f"run {s.verdict_run} on {s.device}, {s.verdict_date}, {s.verdict_timing}: "
                             f"{s.verdict_correct}/{s.verdict_rows} rows correct" if s.verdict_run else
                             "none yet: run `kopt verify`"),
             ("speedup over the baseline (geomean)",
              f"{_x(g.uniform)} uniform ({g.n_uniform} cases), {_x(g.ragged)} ragged ({g.n_ragged})"
              + (f", {_x(g.seed)} seed shapes" if g.seed else "")),
             ("% of the roofline limit (geomean)", f"{_p(g.pct_limit)} uniform, {_p(g.pct_limit_ragged)} ragged"),
             ("held-out draws (the number to move)",
              f"{_x(g.heldout)} over {g.n_heldout} draws, {_p(g.pct_limit_heldout)} of the limit" if g.n_heldout else
              "NA: no verdict yet; run `kopt verify`" if not s.verdict_run else
              "NA: the shown verdict has no held-out rows (it predates the workload library); run `kopt verify`"),
             ("best by the improvement rule", f"`{s.rule_best}`" + (" (the shown one)" if s.rule_best == s.candidate_id
                                                                    else "") if s.rule_best else "none yet"),
             ("named cases", f"{len(cases)} in bench/cases.yaml: "
              + ", ".join(f"{k} {ranges(v)}" for k, v in kinds.items()))]
    hw = c.hardware
    if hw is not None and hw.read_gbps:  # read only where the shown verdict names its device
        floor = f", launch floor {hw.floor_ms * 1000:.2f} µs" if hw.floor_ms else ""
        table.append(("roofline of the limit", f"read ceiling {hw.read_gbps:.0f} GB/s measured on {s.device}"
                                               f"{floor} (results/{cache_file(s.device, ws).name})"))
    for p in c.peers.values():
        gm, n = p.geomean_best()
        cases = f"{n} case" + ("" if n == 1 else "s")
        table.append((f"peers on {p.device}", f"{_x(gm)} over the best peer per case ({cases}, run {p.run_id}, "
                                              f"{p.date})" + (f"; {p.stale}" if p.stale else "")))
    lines += ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in table]
    if groups := ranking.heldout_by_plan(rows, c.floor_ms):
        lines += ["", "Where the held-out geomean is lost (plan: the kernel a draw ran; floor: its limit is the launch "
                      "floor; the last column: the held-out geomean were that plan's draws at their limit):", "",
                  "| plan | draws | geomean % of the limit | lowest draw | held-out geomean, this plan at the limit |",
                  "|---|---:|---:|---|---:|"]
        lines += [f"| {k.plan} | {k.n} | {_p(k.pct_limit)} | {k.lowest['case']} (seed {k.lowest['heldout_seed']}): "
                  f"{_p(k.lowest['pct_limit'])} | {_p(k.heldout_at_limit)} |" for k in groups]
    return "\n".join(lines + ["", "Per case: `kopt status`, `kopt candidates`, results/tilelang/report.html.", ""])


def write(ws: Path, campaign=None) -> Path:
    """Write results/STATUS.md (atomically); returns its path."""
    from kopt import atomic

    return atomic.write_text(Path(ws) / STATUS_REL, markdown(ws, campaign))
