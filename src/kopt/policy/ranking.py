"""Candidate ranking over candidates.jsonl: best per case, geomean per candidate, lineage.

Rows are read as raw dicts (kopt.store.ledger.load_dicts) so rows of older schema versions still
rank: a missing field is NA, never a guess. Two layers:

- small pure-Python helpers (`row_cid`, `latest_verdict`, `geomean_of`, `geomeans`) used by journal/vcs/loop,
  which must stay fast and pandas-free on every commit;
- pandas tables (`load_frame`, `rank`, `best_per_case`, `case_ranking`) for `kopt candidates`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from kopt.candidate import ID_LEN, short_id
from kopt.timing.stats import geomean

#: Ledger fields the ranking reads; anything missing in an old row becomes NA.
COLUMNS = ["row_id", "timestamp", "mode", "kind", "candidate_id", "candidate_hash", "parent_id",
           "technique", "case", "case_kind", "variant", "correct", "status", "runtime_ms", "ref_runtime_ms",
           "speedup", "pct_limit", "device", "run_id", "verdict_rows", "config"]
#: Modes that measure a candidate (calibrate rows measure the harness, not a candidate).
CANDIDATE_MODES = ("verdict", "signal", "tune")


# ---------------------------------------------------------------- pure-Python helpers

def row_cid(row: dict) -> Optional[str]:
    """Candidate id of a raw row: candidate_id, else the short id of candidate_hash (old rows)."""
    cid = row.get("candidate_id") or short_id(row.get("candidate_hash") or "")
    return cid or None


def noisy_sides(row: dict) -> str:
    """Which timings of a row were flagged noisy: 'candidate', 'ref', 'both' or ''."""
    cand = bool((row.get("timing") or {}).get("noisy"))
    ref = bool((row.get("ref_timing") or {}).get("noisy"))
    return {(True, True): "both", (True, False): "candidate", (False, True): "ref"}.get((cand, ref), "")


def row_speedup(row: dict) -> Optional[float]:
    """SPEEDUP of a raw row, recomputed from REF_RUNTIME / RUNTIME when only the times are stored."""
    s = row.get("speedup")
    if isinstance(s, (int, float)) and s > 0:
        return float(s)
    rt, ref = row.get("runtime_ms"), row.get("ref_runtime_ms")
    if isinstance(rt, (int, float)) and isinstance(ref, (int, float)) and rt > 0 and ref > 0:
        return ref / rt
    return None


def _is_case_row(row: dict) -> bool:
    return row.get("kind", "case") == "case"


def verdict_runs(rows: Iterable[dict], cid: Optional[str] = None, device: Optional[str] = None) -> list[list[dict]]:
    """The `kopt verify` runs of candidate `cid` (default: of the last verdict row), optionally on one device:
    the rows of each run (they share a run_id; older rows without one form one run), runs ordered by their
    last row."""
    verdicts = [r for r in rows if r.get("mode") == "verdict" and _is_case_row(r) and row_cid(r)
                and (device is None or r.get("device") == device)]
    if not verdicts:
        return []
    cid = cid or row_cid(verdicts[-1])
    runs: dict[str, list[dict]] = {}
    last: dict[str, int] = {}
    for i, r in enumerate(verdicts):
        if row_cid(r) == cid:
            rid = r.get("run_id") or ""
            runs.setdefault(rid, []).append(r)
            last[rid] = i
    return [runs[rid] for rid in sorted(runs, key=last.__getitem__)]


def planned_rows(run: list[dict]) -> int:
    """The rows a verify run planned to write (its rows' verdict_rows; 0 for rows older than the count)."""
    return max(r.get("verdict_rows") or 0 for r in run)


def run_finished(run: list[dict]) -> bool:
    """Whether a verify run wrote all the rows it planned; a run stopped before its end (killed, out of time)
    is no verdict. Rows older than the count are taken as they are."""
    return len(run) >= planned_rows(run)


def latest_verdict(rows: Iterable[dict], cid: Optional[str] = None, device: Optional[str] = None) -> list[dict]:
    """The latest verdict row per (case, variant) of candidate `cid` (default: of the last verdict row);
    with `device`, of its latest verdict on that device: the rows of its latest finished run."""
    return latest_finished(verdict_runs(rows, cid, device))


def latest_finished(runs: list[list[dict]]) -> list[dict]:
    """The latest row per (case, variant) of the last finished run among `runs` (verdict_runs' order)."""
    finished = [run for run in runs if run_finished(run)]
    if not finished:
        return []
    latest: dict[tuple, dict] = {}
    for r in finished[-1]:
        latest[(r.get("case"), r.get("variant") or "")] = r  # file order is append order
    return sorted(latest.values(), key=lambda r: (r.get("case") or 0, r.get("variant") or ""))


def verdict_device(rows: Iterable[dict]) -> Optional[str]:
    """The device a set of verdict rows was measured on (the first row's; None when unknown)."""
    return next((r.get("device") for r in rows if r.get("device") not in (None, "", "NA")), None)


def is_ragged(row: dict) -> bool:
    """Whether a raw row measured a ragged case (rows older than the ragged cases are uniform)."""
    return row.get("case_kind") == "ragged"


#: The groups a verdict's timed rows are judged in, each with its own geomeans (kopt.eval.verdict).
GROUPS = ("uniform", "ragged", "seed", "heldout", "custom")


def group_of(row: dict) -> str:
    """The group of a raw row: uniform (edge and perf cases, and rows older than case kinds), ragged, seed,
    heldout (a draw from the workload library) or custom (a shape given on the command line)."""
    kind = row.get("case_kind")
    return "uniform" if kind in (None, "edge", "perf") else str(kind)


def is_uniform(row: dict) -> bool:
    """Whether a raw row counts toward the uniform geomean (GEOMEAN_SPEEDUP)."""
    return group_of(row) == "uniform"


def geomean_of(rows: Iterable[dict]) -> tuple[Optional[float], int]:
    """(geomean speedup over the correct uniform rows, number of such rows); (None, 0) when there are none.
    Ragged rows are left out: they have their own geomean (`geomeans`)."""
    sp = [s for r in rows if r.get("correct") is True and is_uniform(r) and (s := row_speedup(r))]
    return geomean(sp), len(sp)


@dataclass
class Geomeans:
    """The aggregates of one set of rows, uniform and ragged cases apart (the Verdict line's four)."""

    uniform: Optional[float] = None
    n_uniform: int = 0
    ragged: Optional[float] = None
    n_ragged: int = 0
    pct_limit: Optional[float] = None
    """Geomean of PCT_LIMIT over the correct uniform rows that have one."""
    pct_limit_ragged: Optional[float] = None
    heldout: Optional[float] = None
    """Geomean speedup over the correct held-out rows (draws from the workload library)."""
    n_heldout: int = 0
    pct_limit_heldout: Optional[float] = None
    seed: Optional[float] = None
    """Geomean speedup over the seed cases (the seed projects' own model shapes)."""
    pct_limit_seed: Optional[float] = None


def geomeans(rows: Iterable[dict]) -> Geomeans:
    """Speedup and PCT_LIMIT geomeans over the correct rows, each group (GROUPS) apart."""
    ok = [r for r in rows if r.get("correct") is True]
    by = {g: [r for r in ok if group_of(r) == g] for g in GROUPS}
    g, n = geomean_of(by["uniform"])

    def sp(rs: list[dict]) -> list[float]:
        return [s for r in rs if (s := row_speedup(r))]

    def pct(rs: list[dict]) -> Optional[float]:
        return geomean([p for r in rs if isinstance(p := r.get("pct_limit"), (int, float))])

    return Geomeans(g, n, geomean(sp(by["ragged"])), len(sp(by["ragged"])), pct(by["uniform"]), pct(by["ragged"]),
                    geomean(sp(by["heldout"])), len(sp(by["heldout"])), pct(by["heldout"]),
                    geomean(sp(by["seed"])), pct(by["seed"]))


def heldout_ratio(mine: Iterable[dict], theirs: Iterable[dict]) -> Optional[float]:
    """Geomean over the held-out draws both candidates ran correctly (matched by case id within one draw) of
    my SPEEDUP / theirs: above 1, this candidate is faster where it will be deployed; None when none match.
    Each SPEEDUP is against the same baseline on the same shape, so the ratio is the two candidates' time
    ratio with the baseline's session drift divided out."""
    def by_case(rows: Iterable[dict]) -> dict:
        return {r.get("case"): s for r in rows if group_of(r) == "heldout" and r.get("correct") is True
                and (s := row_speedup(r))}

    a, b = by_case(mine), by_case(theirs)
    return geomean([a[c] / b[c] for c in a if c in b])


def plan_class(plan: Optional[dict], at_floor: bool) -> str:
    """A plan's class: its kernel less `decode_` ("direct", "split_combine", "split_last", "balanced"; "c-target" on
    the CPU path; "NA" for a row without a plan), and "floor" where the case's limit is the launch floor."""
    plan = plan or {}
    kernel = str(plan.get("kernel") or plan.get("path") or "NA").removeprefix("decode_")
    return kernel + (" floor" if at_floor else "")


def row_plan_class(row: dict, floor_ms: Optional[float] = None) -> str:
    """plan_class of a ledger row's plan, "floor" where the row's limit is the launch floor floor_ms (when known)."""
    lim = row.get("limit_ms")
    return plan_class(row.get("plan"), bool(floor_ms) and isinstance(lim, (int, float)) and lim <= floor_ms * 1.001)


@dataclass(frozen=True)
class PlanGroup:
    """The held-out draws of one plan class (heldout_by_plan)."""

    plan: str
    n: int
    pct_limit: float
    """Geomean % of the limit over the class's draws."""
    lowest: dict
    """The class's lowest draw: case, heldout_seed, pct_limit."""
    heldout_at_limit: float
    """The geomean % of the limit over all the held-out draws were this class's draws at their limit (100%):
    what closing this class alone would give."""


def heldout_by_plan(rows: Iterable[dict], floor_ms: Optional[float] = None) -> list[PlanGroup]:
    """Where the held-out geomean is lost: the correct held-out rows with a % of the limit, grouped by the plan they
    ran (plan_class; "floor" where the row's limit is the launch floor floor_ms, when it is known), lowest geomean
    first. Empty without such rows."""
    held = [(row_plan_class(r, floor_ms), r) for r in rows if group_of(r) == "heldout" and r.get("correct") is True
            and isinstance(r.get("pct_limit"), (int, float)) and r["pct_limit"] > 0]
    out = []
    for cls in {c for c, _ in held}:
        rs = [r for c, r in held if c == cls]
        low = min(rs, key=lambda r: r["pct_limit"])
        out.append(PlanGroup(cls, len(rs), geomean([r["pct_limit"] for r in rs]),
                             {k: low.get(k) for k in ("case", "heldout_seed", "pct_limit")},
                             geomean([100.0 if c == cls else r["pct_limit"] for c, r in held])))
    return sorted(out, key=lambda g: (g.pct_limit, g.plan))


def reigning_rows(rows: Iterable[dict], run_id: Optional[str]) -> list[dict]:
    """The reigning candidate's rows timed on the held-out draws of verify run `run_id` (mode=heldout)."""
    return [r for r in rows if run_id and r.get("mode") == "heldout" and r.get("paired_run") == run_id]


def failed(rows: Iterable[dict]) -> bool:
    """Whether a verdict failed: no rows, or any row incorrect / not ok."""
    rows = list(rows)
    return not rows or any(r.get("correct") is not True or r.get("status", "ok") != "ok" for r in rows)


# ---------------------------------------------------------------- pandas tables

def load_frame(path: Path, device: Optional[str] = None, loaded=None):
    """Ledger -> (DataFrame of case rows with normalized columns and file order `seq`, skipped lines).

    With `device`, only rows measured on that device (times from different devices never mix in a rank).
    `loaded`: the ledger already read with kopt.store.ledger.load_dicts (not read again).
    """
    import pandas as pd

    from kopt.store import load_dicts

    loaded = loaded if loaded is not None else load_dicts(path)
    df = pd.DataFrame.from_records(loaded.rows, columns=COLUMNS) if loaded.rows else pd.DataFrame(columns=COLUMNS)
    df["seq"] = range(len(df))
    df["kind"] = df["kind"].where(df["kind"].notna(), "case")
    df = df[df["kind"] == "case"].copy()
    df["mode"] = df["mode"].where(df["mode"].notna(), "signal")
    cid = df["candidate_id"].where(df["candidate_id"].astype(bool) & df["candidate_id"].notna(), None)
    df["candidate_id"] = cid.fillna(df["candidate_hash"].astype("string").str[:ID_LEN]).replace("", None)
    for col in ("case", "runtime_ms", "ref_runtime_ms", "speedup", "pct_limit"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    ratio = df["ref_runtime_ms"] / df["runtime_ms"]
    df["speedup"] = df["speedup"].where(df["speedup"] > 0, ratio.where(df["runtime_ms"] > 0))
    df["correct"] = df["correct"].eq(True)
    # Cast first: an all-missing column is float64, and filling it with a string is deprecated.
    df["variant"] = df["variant"].astype(object).fillna("").astype(str)
    df["status"] = df["status"].astype(object).fillna("NA").astype(str)
    df["device"] = df["device"].astype(object).fillna("NA").astype(str)
    if device:
        df = df[df["device"].str.lower() == device.lower()]
    return df.dropna(subset=["candidate_id", "case"]), loaded.skipped


def _basis_rows(df):
    """Latest row per (candidate, case, variant) of the candidate's best basis: verdict rows when it has
    any, else signal (bench) rows, else tune rows (each the fastest config of a case, quick timing:
    labelled so, never mixed with the other two)."""
    d = df[df["mode"].isin(CANDIDATE_MODES)]
    d = d[~(d["mode"].eq("verdict") & _stopped(d))]  # a verify run stopped before its end is no verdict
    rank_of = {m: i for i, m in enumerate(CANDIDATE_MODES)}
    best = d.assign(_r=d["mode"].map(rank_of)).groupby("candidate_id")["_r"].min()
    d = d[d["mode"].map(rank_of) == d["candidate_id"].map(best)]
    d = d.drop_duplicates(["candidate_id", "case", "variant"], keep="last")
    return d.assign(basis=d["mode"])


def _stopped(df):
    """Per row: whether it belongs to a run with fewer rows than its verdict_rows (a `kopt verify` stopped
    before its end: run_finished, on the frame; latest_verdict skips those runs too)."""
    import pandas as pd

    want = pd.to_numeric(df["verdict_rows"], errors="coerce").fillna(0)
    by_run = df["run_id"].astype(object).fillna("").astype(str)
    size = by_run.map(by_run.value_counts())
    return by_run.ne("") & (size < want.groupby(by_run).transform("max"))


def parents(df) -> dict[str, str]:
    """candidate_id -> parent_id (the first non-empty parent recorded for it)."""
    p = df[df["parent_id"].notna() & (df["parent_id"] != "")].drop_duplicates("candidate_id")
    return dict(zip(p["candidate_id"], p["parent_id"]))


def lineage(parent_of: dict[str, str], cid: str, limit: int = 50) -> list[str]:
    """The parent chain of a candidate, itself first; stops at a root, a cycle or `limit` steps."""
    chain = [cid]
    while (p := parent_of.get(chain[-1])) and p not in chain and len(chain) < limit:
        chain.append(p)
    return chain


def rank(df):
    """One row per candidate: geomean speedup over its correct uniform cases and, apart, over its ragged
    ones, with the PCT_LIMIT geomeans (verdict basis preferred).

    Order: candidates without an incorrect case first, then the uniform geomean, then number of cases.
    """

    d = _basis_rows(df)
    rag = d["case_kind"].eq("ragged")
    uni = d["case_kind"].isna() | d["case_kind"].isin(["edge", "perf"])
    held = d["case_kind"].eq("heldout")
    g = _log_mean(d[uni], "speedup", "geomean", "n_cases").join(
        [_log_mean(d[rag], "speedup", "geomean_ragged", "n_ragged"),
         _log_mean(d[uni], "pct_limit", "pct_limit"), _log_mean(d[rag], "pct_limit", "pct_limit_ragged"),
         _log_mean(d[held], "speedup", "geomean_heldout", "n_heldout")],
        how="outer")
    info = d.groupby("candidate_id").agg(basis=("basis", "first"), n_rows=("case", "size"),
                                         n_correct=("correct", "sum"), last_seq=("seq", "max"))
    info["n_incorrect"] = info["n_rows"] - info["n_correct"]
    tech = df[df["technique"].notna()].drop_duplicates("candidate_id", keep="last").set_index("candidate_id")
    out = info.join(g, how="left").join(tech[["technique"]], how="left")
    for col in ("n_cases", "n_ragged", "n_heldout"):
        out[col] = out[col].fillna(0).astype(int)
    parent_of = parents(df)
    out["parent_id"] = [parent_of.get(c) for c in out.index]
    # A candidate that failed a case never outranks one that passed all of its cases.
    out["clean"] = out["n_incorrect"] == 0
    out = out.reset_index().sort_values(["clean", "geomean", "n_cases", "last_seq"], ascending=False,
                                        na_position="last", kind="stable")
    out.insert(0, "rank", range(1, len(out) + 1))
    cols = ["rank", "candidate_id", "geomean", "n_cases", "geomean_ragged", "n_ragged", "pct_limit",
            "pct_limit_ragged", "geomean_heldout", "n_heldout", "n_incorrect", "basis", "parent_id", "technique"]
    return out[cols].reset_index(drop=True)


def _log_mean(d, col: str, name: str, count: Optional[str] = None):
    """Per-candidate geomean of a positive column over the correct rows (and, with `count`, how many)."""
    import numpy as np

    ok = d[d["correct"] & (d[col] > 0)]
    agg = {name: ("logs", "mean")} | ({count: ("logs", "size")} if count else {})
    g = ok.assign(logs=np.log(ok[col])).groupby("candidate_id").agg(**agg)
    g[name] = np.exp(g[name])
    return g


def best(df) -> Optional[dict]:
    """The top-ranked candidate's row of rank(df) as a dict, or None for an empty ledger."""
    top = records(rank(df).head(1))
    return top[0] if top else None


def best_on(path: Path, device: Optional[str], loaded=None) -> Optional[dict]:
    """best() over the ledger's rows measured on `device` (every row: None); `loaded` as load_frame's."""
    return best(load_frame(path, device, loaded)[0])


def records(df) -> list[dict]:
    """DataFrame -> JSON-ready dicts, NaN as None (printed NA)."""
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
            for r in df.astype(object).to_dict("records")]


def basis_of(mode: str, config) -> str:
    """Which command measured a row, as best-per-case tables say it: verdict, bench, `bench --config` (a one-off
    config, not the candidate's own choice) or `tune screen` (the tuner's quick timing of its winner)."""
    if mode == "tune":
        return "tune screen"
    if mode == "signal":
        return "bench --config" if isinstance(config, dict) and config else "bench"
    return str(mode)


def best_per_case(df, case: Optional[int] = None):
    """The fastest correct row of each (case, variant), any mode but calibrate; `basis` says which command measured
    it (basis_of), so a one-off config or a tune screen is never read as the candidate's own figure."""
    d = df[df["mode"].isin(CANDIDATE_MODES) & df["correct"] & (df["runtime_ms"] > 0)]
    d = d[~d["case_kind"].isin(["heldout", "custom"])]  # a draw's id names another shape in every draw
    if case is not None:
        d = d[d["case"] == case]
    best = d.sort_values(["runtime_ms", "seq"]).drop_duplicates(["case", "variant"], keep="first")
    best = best.assign(basis=[basis_of(m, c) for m, c in zip(best["mode"], best["config"])])
    cols = ["case", "variant", "candidate_id", "runtime_ms", "ref_runtime_ms", "speedup", "pct_limit", "mode", "basis"]
    return best.sort_values(["case", "variant"])[cols].reset_index(drop=True)


def case_ranking(df, case: int):
    """All candidates on one case: each candidate's fastest correct row, fastest first."""
    d = df[(df["case"] == case) & df["mode"].isin(CANDIDATE_MODES) & df["correct"] & (df["runtime_ms"] > 0)]
    d = d.sort_values(["runtime_ms", "seq"]).drop_duplicates(["candidate_id", "variant"], keep="first")
    cols = ["candidate_id", "variant", "runtime_ms", "ref_runtime_ms", "speedup", "pct_limit", "mode"]
    out = d[cols].reset_index(drop=True)
    out.insert(0, "rank", range(1, len(out) + 1))
    return out


@dataclass
class Report:
    """What `kopt candidates` shows: ranked candidates (or one case's ranking) and the best per case."""

    candidates: Any
    best_per_case: Any
    lineage: dict[str, list[str]] = field(default_factory=dict)
    skipped: list = field(default_factory=list)
    case: Optional[int] = None
    rows: list = field(default_factory=list)
    """The ledger's raw rows, read once (kopt.policy.shown reads them too)."""


def report(path: Path, top: Optional[int] = None, case: Optional[int] = None,
           device: Optional[str] = None, loaded=None) -> Report:
    """The library call behind `kopt candidates`. `loaded`: the ledger already read (load_dicts), not read again."""
    from kopt.store import load_dicts

    loaded = loaded if loaded is not None else load_dicts(path)
    df, skipped = load_frame(path, device, loaded)
    table = case_ranking(df, case) if case is not None else rank(df)
    if top:
        table = table.head(top)
    parent_of = parents(df)
    lin = {c: lineage(parent_of, c) for c in table["candidate_id"]}
    return Report(table, best_per_case(df, case), lin, skipped, case, loaded.rows)
