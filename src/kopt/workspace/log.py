"""`kopt log`: the next ITERATIONS.md entry, built from the workspace (Changes from git, Bench from the current
candidate's own rows: its latest verdict judged against the best iteration, else its bench rows, not judged) and
appended through kopt.store.journal."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Optional

from kopt.errors import UsageError, WorkspaceError
from kopt.records import fmt_na
from kopt.store.journal import Entry, add_entry, journal_file, parse, read, render_entry


def changes_section(ws: Path) -> str:
    """`git diff --stat` of the workspace paths (HEAD vs working tree) plus untracked files."""
    from kopt.store import vcs

    stat = vcs.diff_stat(ws)
    if stat is None:
        return "_(not a git repository: no diff; run `kopt init`)_"
    return f"```\n{stat}\n```" if stat else "_(no changes in the workspace paths since HEAD)_"


def _table(rows: list[dict], source: bool = False) -> tuple[list[str], list[str]]:
    """Markdown table of rows (% of the roofline limit beside the speedup; with `source`, which command measured
    each row) and the cases whose timing was flagged noisy."""
    from kopt.policy import ranking

    head = "| case | runtime ms | ref ms | speedup | % limit | noisy | status |"
    rule = "|---:|---:|---:|---:|---:|---|---|"
    if source:
        head, rule = head.replace("| case |", "| case | source |"), rule.replace("|---:|", "|---:|---|", 1)
    out, noisy_cases = [head, rule], []
    for r in rows:
        group = ranking.group_of(r)
        case = " ".join(str(x) for x in (r.get("case"), "" if group == "uniform" else group, r.get("model"),
                                         r.get("shape"), r.get("variant")) if x)
        s = ranking.row_speedup(r) if r.get("correct") is True else None
        noisy = ranking.noisy_sides(r)
        if noisy:
            noisy_cases.append(f"{r.get('case')} ({noisy})")
        src = f" {row_source(r)} |" if source else ""
        out.append(f"| {case} |{src} {fmt_na(r.get('runtime_ms'))} | {fmt_na(r.get('ref_runtime_ms'))} | "
                   f"{fmt_na(s or None, '{:.3f}x')} | {fmt_na(r.get('pct_limit'), '{:.1f}')} | {noisy} | "
                   f"{r.get('status', 'NA')} |")
    return out, noisy_cases


def row_source(r: dict) -> str:
    """Which command measured a row, as the Bench table says it: verdict, bench, bench --config, screen, tune."""
    mode = r.get("mode") or "signal"
    if mode == "signal":
        return "bench --config" if r.get("config") else "bench"
    return {"screen": "quick verdict (screen)", "tune": "tune screen"}.get(mode, mode)


def signal_rows(rows: list[dict], cid: Optional[str]) -> list[dict]:
    """Candidate `cid`'s latest bench (and quick-verdict screen) row per case and variant, in case order."""
    from kopt.policy import ranking

    latest: dict[tuple, dict] = {}
    for r in rows:
        if r.get("mode") in ("signal", "screen") and r.get("kind", "case") == "case" and ranking.row_cid(r) == cid:
            latest[(r.get("case"), r.get("variant") or "", r.get("model") or "")] = r
    return sorted(latest.values(), key=lambda r: (r.get("case") or 0, r.get("variant") or ""))


def bench_section(ws: Path) -> str:
    """The Bench of the current solution's candidate, from its own rows only: its latest verdict (judged against
    the best iteration by kopt.policy.iterations.judge), else its bench and screen rows, labelled so and not
    judged. Never another candidate's rows."""
    from kopt.paths import ledger_file
    from kopt.policy import iterations, ranking
    from kopt.store import load_dicts

    cid = iterations.current_candidate(ws)
    rows = load_dicts(ledger_file(ws)).rows
    latest = ranking.latest_verdict(rows, cid) if cid else []
    ab = ab_section(rows, cid)
    if not latest:
        return _signal_section(rows, cid, bool(ab)) + ab
    got = cid
    out, noisy_cases = _table(latest)
    g = ranking.geomeans(latest)
    gm = g.uniform
    where = sorted({f"{r['device']} vs {r.get('ref') or 'NA'}" for r in latest if r.get("device") not in (None, "NA")})
    line = (f"Candidate `{got}` (verdict){' on ' + ', '.join(where) if where else ''}: geomean speedup "
            f"{fmt_na(gm, '{:.3f}')}x over {g.n_uniform} correct case(s)")
    if g.n_ragged:
        line += f", ragged {fmt_na(g.ragged, '{:.3f}')}x over {g.n_ragged}"
    if g.pct_limit is not None or g.pct_limit_ragged is not None:
        line += f"; % of limit {fmt_na(g.pct_limit, '{:.1f}')} (ragged {fmt_na(g.pct_limit_ragged, '{:.1f}')})"
    if g.n_heldout or g.seed is not None:
        line += (f"; held-out {fmt_na(g.heldout, '{:.3f}')}x over {g.n_heldout} draw(s) at "
                 f"{fmt_na(g.pct_limit_heldout, '{:.1f}')}% of limit (the number to move), seed cases "
                 f"{fmt_na(g.seed, '{:.3f}')}x")
    dev = ranking.verdict_device(latest)
    gen = iterations.timing_generation(latest)
    hist = [it for it in iterations.history(ws, rows) if it.candidate_id != got or it.device != dev]  # not its own
    best = iterations.best_iteration([it for it in hist if it.generation == gen], dev)
    other = iterations.best_iteration(hist, dev)
    if ranking.failed(latest):
        line += "; a verdict row failed -> failed (no speed counts until every row is correct)."
    elif best is None and other is not None and other.geomean is not None:
        was = iterations.GENERATIONS[other.generation]
        line += (f"; the first verdict on {dev} timed {iterations.GENERATIONS[gen]}: a new baseline (the previous "
                 f"best, iter {other.iteration} at {other.geomean:.3f}x, was timed {was} and is not compared with it).")
    elif best is None or best.geomean is None:
        line += f"; no previous best iteration on {dev or 'this device'}."
    elif gm is not None:
        thr = iterations.threshold(ws, dev, rows)
        bg, br, pair = iterations.best_side(rows, best.candidate_id, got, dev, gen, latest, best.geomean,
                                            best.geomean_ragged)
        j = iterations.judge(gm, g.ragged, False, bg, br, thr)
        j = iterations.weigh_heldout(j, latest, rows, thr)
        prev = f"{bg:.3f}x" + (f" (ragged {br:.3f}x)" if br else "")
        line += (f"; previous best {prev} (iter {best.iteration}, `{best.candidate_id}`): "
                 f"{j.reason}{'; ' + pair.note() if pair else ''} -> {j.outcome} (threshold +{thr * 100:.1f}%).")
    else:
        line += f"; previous best {best.geomean:.3f}x (iter {best.iteration}) -> failed (no correct case)."
    if noisy_cases:
        line += (f"\n\nNoisy timing (interquartile range over the noise limit) on case {', '.join(noisy_cases)}: "
                 "those speedups can move between runs by more than the A/A spread.")
    return "\n".join(out) + "\n\n" + line + ab


def ab_rows(rows: list[dict], cid: Optional[str]) -> list[tuple[dict, dict]]:
    """Candidate `cid`'s latest A/B reading per case, variant, draw and earlier candidate: (its `kopt peers` row, the
    peer entry of the earlier candidate file it was paired with), in case order."""
    from kopt.policy import ranking

    if not cid:
        return []
    latest: dict[tuple, tuple] = {}
    for r in rows:
        if r.get("mode") != "peers" or ranking.row_cid(r) != cid:
            continue
        for p in r.get("peers") or []:
            if str(p.get("peer", "")).startswith("cand-"):
                key = (r.get("case"), r.get("variant") or "", r.get("model") or "", r.get("heldout_seed"), p["peer"])
                latest[key] = (r, p)
    return [latest[k] for k in sorted(latest, key=lambda k: (k[0] or 0, k[1], str(k[3]), k[4]))]


def ab_section(rows: list[dict], cid: Optional[str]) -> str:
    """The candidate's A/B readings against earlier candidates (`kopt peers --peers OLD.py`: paired in one child),
    a table after the Bench's own rows; empty when it has none. Signals, never judged."""
    got = ab_rows(rows, cid)
    if not got:
        return ""
    out = ["", "", "A/B against earlier candidates (`kopt peers --peers OLD.py`, paired in one child; not judged):", "",
           "| case | draw | variant | device | this ms | earlier | its ms | this vs it | CI |",
           "|---:|---|---|---|---:|---|---:|---:|---|"]
    for r, p in got:
        ci = p.get("speedup_ci") or [None, None]
        seed = r.get("heldout_seed")
        draw = f"{seed}: {r.get('model')}" if seed is not None else (r.get("model") or "")
        mine = (p.get("timing") or {}).get("median_ms", r.get("runtime_ms"))  # this side of the pair
        theirs = (p.get("ref_timing") or {}).get("median_ms")
        cells = [r.get("case"), draw, r.get("variant") or "", r.get("device") or "NA", fmt_na(mine, "{:.4f}"),
                 f"`{p['peer']}`"]
        if p.get("na") is None:
            cells += [fmt_na(theirs, "{:.4f}"), f"{fmt_na(p.get('speedup'), '{:.3f}')}x",
                      f"{fmt_na(ci[0], '{:.3f}')}-{fmt_na(ci[1], '{:.3f}')}"]
        else:
            cells += ["NA", f"NA ({p['na']})", "NA"]
        out.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(out)


def _signal_section(rows: list[dict], cid: Optional[str], ab: bool = False) -> str:
    """The Bench of a candidate without a verdict: its own bench / screen rows, labelled, and `not judged` (``ab``:
    its A/B readings follow)."""
    from kopt.policy import iterations, ranking

    mine = signal_rows(rows, cid)
    if not mine:
        why = ("its A/B readings below" if ab else
               "run `kopt bench` or `kopt verify` before `kopt log`")
        return (f"_(no bench or verdict rows of candidate `{cid or 'NA'}` in candidates.jsonl: {why})_\n\n"
                f"Outcome: {iterations.NOT_JUDGED} ({iterations.NOT_JUDGED_REASON}).")
    out, noisy_cases = _table(mine, source=True)
    g = ranking.geomeans(mine)
    devs = sorted({str(r.get("device")) for r in mine})
    line = (f"Candidate `{cid}`: no verdict, its own bench rows above (on {', '.join(devs)}; geomean speedup "
            f"{fmt_na(g.uniform, '{:.3f}')}x over {g.n_uniform} correct uniform case(s)). Outcome: "
            f"{iterations.NOT_JUDGED} ({iterations.NOT_JUDGED_REASON}; run `kopt verify` to have it judged).")
    if any(r.get("config") for r in mine):
        line += " Rows marked `bench --config` ran a one-off config, not the candidate's own choice."
    if noisy_cases:
        line += f" Noisy timing on case {', '.join(noisy_cases)}."
    return "\n".join(out) + "\n\n" + line


def _title(title: Optional[str], hypothesis: Optional[str], number: int) -> str:
    if title:
        return " ".join(title.split())
    first = (hypothesis or "").strip().split("\n")[0]
    return (first[:57] + "...") if len(first) > 60 else (first or f"iteration {number}")


def log_iteration(ws: Path, title: Optional[str] = None, hypothesis: Optional[str] = None,
                  analysis: Optional[str] = None, next_: Optional[str] = None, replace: bool = False,
                  edit: Optional[Callable[[str], Optional[str]]] = None) -> Entry:
    """Build the next entry (Changes from git, Bench from the ledger: the current candidate's own rows) and append
    it to ITERATIONS.md."""
    from kopt.store import vcs

    path = journal_file(ws)
    _, doc = read(path)
    last = doc.entries[-1].number if doc.entries else 0
    number = vcs.next_iteration(ws, fallback=last + 1)
    pending = bool(doc.entries) and last == number
    if last > number:
        raise WorkspaceError(f"ITERATIONS.md ends at iteration {last} but git has only {number - 1} [iter] "
                             f"commit(s): commit it (`kopt commit`) or fix ITERATIONS.md")
    if pending and not replace:
        raise WorkspaceError(f"iteration {number} is already logged and not committed yet: "
                             f"commit it (`kopt commit -m ...`) or re-log with --replace")
    entry = Entry(number=number, title=_title(title, hypothesis, number), sections={
        "Hypothesis": hypothesis or "", "Changes": changes_section(ws), "Bench": bench_section(ws),
        "Analysis": analysis or "", "Next": next_ or ""})
    if edit is not None:
        edited = edit(render_entry(entry))
        if edited is None:
            raise UsageError("log aborted: the editor closed without saving")
        got = parse(edited)
        if len(got) != 1:
            raise UsageError("log aborted: the edited text must hold exactly one '## Iteration N' entry")
        entry = Entry(number=number, title=got[0].title or entry.title, sections=got[0].sections)
    add_entry(path, entry, replace=pending)
    return entry
