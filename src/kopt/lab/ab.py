"""`kopt lab ab`: the A/B of a kernel change on the cases it touches. The named cases and held-out draws whose plans
the two candidates resolve differently on a device (their device_plan hooks: no compile, no GPU) are the ones timed;
each is timed paired (ABBA, one child) with the old candidate as a peer, and the run ends with one summary line.
An edit of one kernel's code moves no plan: `kernel` adds the cases whose plans run it, `lowered` the cases whose
kernels the two candidates lower to different CUDA (exactly the cases the edit reaches). `resources` compiles each
listed case's kernel of a candidate for the device's arch (no GPU), for its registers and CTAs a unit; both read one
lowering a kernel (`lower`). `save_selection` keeps what a selection lists, for `load_selection` to hand the timing run
on a GPU host, which then lowers nothing."""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional


@dataclass
class Group:
    """The cases of one draw: the named cases (seed None) or a held-out seed's, each with the plan fields the two
    candidates hold apart ("" where they agree)."""

    seed: Optional[int]
    cases: list
    fields: dict = field(default_factory=dict)
    #: the kernels each case's new plan launches (select fills it)
    kernels: dict = field(default_factory=dict)
    #: how many cases the selection considered, where `cases` holds only the changed ones (load_selection)
    considered: Optional[int] = None

    @property
    def changed(self) -> list:
        """The cases whose plans differ: the ones an A/B must time."""
        return [c for c in self.cases if self.fields.get(c.id)]

    @property
    def of(self) -> int:
        """How many cases the selection considered (all of `cases`, unless a loaded selection kept only the changed)."""
        return len(self.cases) if self.considered is None else self.considered

    @property
    def label(self) -> str:
        return "named" if self.seed is None else str(self.seed)


def select(new: Path, old: Path, groups: list[Group], device: str, kernel: Optional[str] = None,
           lowered: bool = False, cache: Optional[dict] = None) -> list[Group]:
    """Each group with its cases' plan fields apart between `new` and `old` on `device` (a hardware.yaml GPU name).
    `kernel` (kernels the change edits without moving any plan, e.g. decode_balanced, or a comma-separated list): a
    case whose new plan runs one of them is changed too, marked ``kernel=NAME`` where no plan field moves.
    `lowered`: a case whose plans agree but whose kernels the two candidates lower to different CUDA (lowered_apart)
    is changed too, marked ``lowered``. `cache` (lower's): the lowerings, kept for resources."""
    from kopt.doctor import case_plans, plan_fields_apart

    for g in groups:
        mine, theirs = case_plans(device, g.cases, new), case_plans(device, g.cases, old)
        g.fields, g.kernels = {}, {}
        for c, a, b in zip(g.cases, mine, theirs):
            apart = ",".join(plan_fields_apart(a["plan"], b["plan"]))
            g.kernels[c.id] = list((a["plan"] or {}).get("kernels") or ())
            runs = [k for k in (kernel or "").split(",") if k and k in g.kernels[c.id]]
            g.fields[c.id] = apart or (f"kernel={runs[0]}" if runs else "")
        if lowered:
            same = [c for c in g.cases if not g.fields[c.id]]
            if same:
                print(f"lowering {len(same)} case(s) of {g.label} for {device}, both candidates...", file=sys.stderr,
                      flush=True)  # progress: a lowering takes seconds
            for cid, why in lowered_apart(new, old, same, device, cache).items():
                g.fields[cid] = why
    return groups


#: The selection file's format (save_selection / load_selection).
SELECTION_SCHEMA = 1


def save_selection(path: Path, groups: list[Group], device: str, new: Path, old: Path, heldout: int) -> Path:
    """Write the cases an A/B must time (each group's changed cases and why) as JSON, for a later timing run to take
    with load_selection instead of selecting again: the selection's lowerings take seconds a case on a CPU host, and
    a GPU host's time is the scarce one. The file names the device whose plans decided it and both candidates."""
    from kopt import atomic
    from kopt.candidate import candidate_id

    data = {"schema": SELECTION_SCHEMA, "device": device, "new": candidate_id(new), "old": candidate_id(old),
            "heldout": heldout,
            "groups": [{"seed": g.seed, "considered": g.of,
                        "cases": {str(c.id): g.fields[c.id] for c in g.changed}} for g in groups]}
    return atomic.write_text(Path(path), json.dumps(data, indent=1) + "\n")


def load_selection(path: Path, device: str, new: Path, old: Path) -> list[Group]:
    """The groups a save_selection file holds, each with only its changed cases. A usage error when the file is
    unreadable or not a selection, or when it was made for another device's plans or other candidates (their ids
    differ): a selection proves which cases an edit reaches for those files and that device only."""
    from kopt.candidate import candidate_id
    from kopt.errors import UsageError
    from kopt.lab.common import pick_cases

    try:
        data = json.loads(Path(path).read_text())
        if data.get("schema") != SELECTION_SCHEMA:
            raise ValueError(f"schema {data.get('schema')!r}, not {SELECTION_SCHEMA}")
        groups = [(g["seed"], {int(k): str(v) for k, v in g["cases"].items()}, int(g["considered"]))
                  for g in data["groups"]]
        heldout = int(data["heldout"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise UsageError(f"--selection {path}: not a selection file ({_why(e)})") from None
    if data.get("device") != device:
        raise UsageError(f"--selection {path} was made for {data.get('device')}'s plans, this run plans for {device}: "
                         f"select again with --plan-for {device} --dry-run --save-selection")
    ids = {"--candidate": (data.get("new"), candidate_id(new)), "--against": (data.get("old"), candidate_id(old))}
    for opt, (saved, now) in ids.items():
        if saved != now:
            raise UsageError(f"--selection {path} was made for {opt} {saved}, this run's is {now}: select again")
    out = []
    for seed, fields, considered in groups:
        cases = pick_cases(",".join(map(str, sorted(fields))), heldout=heldout if seed is not None else 0,
                           seed=seed) if fields else []
        out.append(Group(seed, cases, fields, considered=considered))
    return out


def _why(e: Exception) -> str:
    """An exception as one NA reason: its type and last line, at most 200 characters."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[-1] if lines else ''}"[:200]


def lower(candidate: Path, cases: list, prof: dict, cache: Optional[dict] = None) -> dict:
    """case id -> the candidate's lower_plan(case, prof, its arch) ({"plan", "kernels"}), or the reason (a string) it
    gave none. One lowering a distinct plan and head layout (the source depends on them, not on the batch or the
    lengths: dynamic dims), kept in `cache` (a dict the caller owns: --lowered and --registers of one run share it)."""
    from kopt.candidate import loaded
    from kopt.store import resolve_candidate

    path = resolve_candidate(candidate)
    cache = {} if cache is None else cache
    out = {}
    with loaded(path) as mod:
        for c in cases:
            if not hasattr(mod, "lower_plan"):
                out[c.id] = "the candidate has no lower_plan hook"
                continue
            shape = c.shape_dict()
            try:
                plan = mod.device_plan(shape, prof) if hasattr(mod, "device_plan") else shape
                key = (str(path), prof.get("name"), json.dumps(
                    [plan, [shape.get(k) for k in ("kv_heads", "gqa", "head_dim", "dtype", "page_size")]],
                    sort_keys=True, default=str))
                if key not in cache:
                    cache[key] = mod.lower_plan(shape, prof, prof["arch"])
                out[c.id] = cache[key]
            except Exception as e:  # noqa: BLE001 (a case that does not lower is this case's NA)
                out[c.id] = _why(e)
    return out


def lowered_apart(new: Path, old: Path, cases: list, device: str, cache: Optional[dict] = None) -> dict:
    """case id -> ``lowered`` where `new` and `old` lower the case's kernels for `device`'s arch to different CUDA or
    dynamic shared memory, "" where they lower to the same; ``lowered=NA (why)`` where either cannot lower it: a case
    not proven unchanged is timed. Sources are compared in kopt.occupancy.canonical_source's form without the sync
    pass's barriers before workspace reductions, which move from lowering to lowering of one kernel (a
    case whose kernel an edit did not touch was marked otherwise: an MHA draw, seed 20261208)."""
    from kopt.doctor import gpu_profile
    from kopt.occupancy import canonical_source

    if not cases:
        return {}
    prof = gpu_profile(device).model_dump()

    def text(got):  # a lowering as compared: each kernel's canonical source and dynamic shared memory
        return got if isinstance(got, str) else {
            n: (canonical_source(k["source"], barriers=False), k["dyn_smem_bytes"]) for n, k in got["kernels"].items()}

    a, b = lower(new, cases, prof, cache), lower(old, cases, prof, cache)
    out = {}
    for c in cases:
        x, y = text(a[c.id]), text(b[c.id])
        if isinstance(x, str) or isinstance(y, str):
            out[c.id] = f"lowered=NA ({x if isinstance(x, str) else y})"
        else:
            out[c.id] = "lowered" if x != y else ""
    return out


@dataclass(frozen=True)
class Resources:
    """One candidate's kernel for one case as ptxas sees it on the device's arch (kopt.occupancy), or why not."""

    kernel: str = ""
    registers: int = 0
    spill_bytes: int = 0
    ctas: int = 0
    bound: str = ""
    na: str = ""


def resources(candidate: Path, cases: list, device: str, cache: Optional[dict] = None) -> dict:
    """case id -> Resources of the kernel the candidate's plan runs for it on `device` (a hardware.yaml GPU): its
    lowering (lower, `cache` shared with --lowered) compiled by nvcc for the device's arch (no GPU), the CTAs of it a
    unit leaves room for. NA with the reason where the candidate cannot lower it or nvcc fails; one compile a distinct
    source (both candidates of an A/B share them: occupancy.compile_source)."""
    from kopt import occupancy
    from kopt.doctor import gpu_profile

    prof = gpu_profile(device).model_dump()
    arch, smem_unit = prof["arch"], prof.get("smem_per_unit_bytes")
    out = {}
    for cid, got in lower(candidate, cases, prof, cache).items():
        if isinstance(got, str):
            out[cid] = Resources(na=got)
            continue
        try:
            main, plan = got["kernels"]["main"], got["plan"]
            kernels = occupancy.compile_source(main["source"], arch)  # once a distinct source a process
            name = f"{plan['kernels'][0]}_kernel"
            k = next((x for x in kernels if x.name == name), kernels[0])
            n, what = occupancy.ctas_a_unit(k.registers, int(plan["threads"]), int(main["dyn_smem_bytes"]), arch,
                                            smem_unit)
            out[cid] = Resources(k.name.removesuffix("_kernel"), k.registers, k.spill_bytes, n, what)
        except Exception as e:  # noqa: BLE001 (a kernel that does not compile is this line's NA)
            out[cid] = Resources(na=_why(e))
    return out


def registers(new: Path, old: Path, groups: list[Group], device: str, cache: Optional[dict] = None) -> dict:
    """(group label, case id) -> (new, old) Resources of each group's changed cases (--registers), with progress."""
    res = {}
    for g in groups:
        if g.changed:
            print(f"compiling {len(g.changed)} case(s) of {g.label} for {device}, both candidates...",
                  file=sys.stderr, flush=True)  # progress: a compile is seconds a kernel
            mine, theirs = resources(new, g.changed, device, cache), resources(old, g.changed, device, cache)
            res.update({(g.label, c.id): (mine[c.id], theirs[c.id]) for c in g.changed})
    return res


def resources_line(new: Resources, old: Resources) -> str:
    """`registers OLD -> NEW, CTAs a unit OLD -> NEW (bound: what)`, flagged where the new kernel leaves a unit
    fewer CTAs or spills; NA with the reason where either side has none."""
    if new.na or old.na:
        return f"registers NA ({new.na or old.na})"
    line = (f"registers {old.registers} -> {new.registers}, CTAs a unit {old.ctas} -> {new.ctas} "
            f"(bound: {new.bound})")
    if new.ctas < old.ctas:
        line += ", FEWER CTAS A UNIT"
    if new.spill_bytes > old.spill_bytes:
        line += f", SPILLS {old.spill_bytes} -> {new.spill_bytes} B"
    return line


def selection_lines(groups: list[Group], device: str, res: Optional[dict] = None) -> list[str]:
    """What a dry run prints: per group the cases that change and the fields that move (or the kernel they run,
    --kernel), with `res` ((group label, case id) -> (new, old) Resources, --registers) each case's registers and
    CTAs a unit, old -> new; then the count."""
    out = []
    for g in groups:
        ch = g.changed
        out.append(f"{g.label}: {len(ch)} of {g.of} cases to time on {device}"
                   + (f": {','.join(str(c.id) for c in ch)}" if ch else ""))
        for c in ch:
            pair = (res or {}).get((g.label, c.id))
            out.append(f"  {c.id}: {g.fields[c.id]}" + (f"; {resources_line(*pair)}" if pair else ""))
    n = sum(len(g.changed) for g in groups)
    out.append(f"AB_PLAN: CASES:{n} OF:{sum(g.of for g in groups)} DEVICE:{device}")
    return out


def case_line(seed: Optional[int], row, old_peer: str, fields: str) -> tuple[str, Optional[float]]:
    """(the line of one timed case, new-over-old ratio or None): NA with the reason where the pair did not time."""
    p = next((x for x in row.peers if x.peer == old_peer), None)
    where = f"case={row.case} seed={seed if seed is not None else 'named'}"
    if not (row.compiled and row.correct):
        return f"AB {where} NA: the new candidate {'is wrong' if row.compiled else 'did not compile'}", None
    if p is None or p.na or not p.speedup:
        return f"AB {where} NA: the old candidate {p.na if p and p.na else 'did not time'}", None
    if p.correct is False:
        return f"AB {where} NA: the old candidate is wrong here", None
    ci = f"{p.speedup_ci[0]:.3f}-{p.speedup_ci[1]:.3f}" if p.speedup_ci else "NA"
    return (f"AB {where} new_ms={p.timing.median_ms:.4f} old_ms={p.ref_timing.median_ms:.4f} "
            f"new_vs_old={p.speedup:.3f}x ci={ci} fields={fields}", p.speedup)


def summary_line(ratios: list[tuple[str, Optional[float]]]) -> str:
    """`AB: CASES:n TIMED:k GEOMEAN:x MIN:x (where) MAX:x`: new over old (> 1: the new candidate is faster), over the
    cases that timed; NA where none did."""
    got = [(w, r) for w, r in ratios if r]
    if not got:
        return f"AB: CASES:{len(ratios)} TIMED:0 GEOMEAN:NA MIN:NA MAX:NA"
    geo = math.exp(sum(math.log(r) for _, r in got) / len(got))
    lo, hi = min(got, key=lambda x: x[1]), max(got, key=lambda x: x[1])
    return (f"AB: CASES:{len(ratios)} TIMED:{len(got)} GEOMEAN:{geo:.3f}x MIN:{lo[1]:.3f}x ({lo[0]}) "
            f"MAX:{hi[1]:.3f}x ({hi[0]})")


def _timed_by_case(ratios: list[tuple[str, Optional[float]]]) -> dict[str, list[float]]:
    """Each case's timed ratios over the runs, sorted, in the order the cases first came (an untimed case: [])."""
    per: dict[str, list[float]] = {}
    for w, r in ratios:
        per.setdefault(w, [])
        if r is not None:
            per[w].append(r)
    return {w: sorted(rs) for w, rs in per.items()}


def spread_lines(ratios: list[tuple[str, Optional[float]]], processes: int) -> tuple[list[str], list]:
    """Over `processes` runs of the same cases ((where, ratio) in run order, where = 'group/case'): one line a case,
    `AB case=C seed=S median=x min=x max=x timed=k/N` (NA where no run timed it), and each case's (where, median) for
    the summary. A kernel can run at two speeds from one process to the next, which one paired process cannot show."""
    lines, medians = [], []
    for w, got in _timed_by_case(ratios).items():
        seed, case = w.split("/", 1)
        head = f"AB case={case} seed={seed}"
        if not got:
            lines.append(f"{head} NA: no run timed it (timed=0/{processes})")
            medians.append((w, None))
            continue
        med = statistics.median(got)
        lines.append(f"{head} median={med:.3f}x min={got[0]:.3f}x max={got[-1]:.3f}x timed={len(got)}/{processes}")
        medians.append((w, med))
    return lines, medians


def spread_field(ratios: list[tuple[str, Optional[float]]]) -> str:
    """`SPREAD:x (where)`: the widest max over min of one case's ratios across the runs (1.000x: every run agreed);
    NA where no case timed twice."""
    wide = [(w, got[-1] / got[0]) for w, got in _timed_by_case(ratios).items() if len(got) > 1]
    if not wide:
        return "SPREAD:NA"
    w, x = max(wide, key=lambda t: t[1])
    return f"SPREAD:{x:.3f}x ({w})"


def run(new: Path, old: Path, groups: list[Group], opts, peers: list[str], out: Optional[Path],
        emit: Callable[[str], None], processes: int = 1) -> tuple[list[str], bool]:
    """Time each group's changed cases: the new candidate against the old one (and `peers`), paired in one child per
    group (kopt.eval.bench.evaluate_peers, rows in the ledger unless opts.record is off), its CSV and table under
    `out` (default results/<backend>/ab-<device>-<date>/<group>.csv), and the run's record beside them (write_log:
    ab.txt). With `processes` N > 1 every group runs in N children one after another: each line says its process
    (`process=i/N`), each group's CSV its own (`<group>-p<i>.csv`), then a line a case over the N (spread_lines) and
    the summary over each case's median, with SPREAD (spread_field). Returns (the lines, every row correct)."""
    from dataclasses import replace

    from kopt import paths
    from kopt.baselines import CANDIDATE_PEER
    from kopt.candidate import candidate_id
    from kopt.eval import bench
    from kopt.report import panel

    old_peer = f"{CANDIDATE_PEER}{candidate_id(old)}"
    lines: list[str] = []
    ratios: list[tuple[str, Optional[float]]] = []
    ok = True
    folder: Optional[Path] = None
    first: Optional[dict] = None  # a row of the run: its device, versions and time head ab.txt
    for i in range(1, processes + 1):
        tag = f" process={i}/{processes}" if processes > 1 else ""
        for g in groups:
            cases = g.changed
            if not cases:
                continue
            print(f"timing {len(cases)} case(s) of {g.label}, paired{tag.replace('=', ' ')}...", file=sys.stderr,
                  flush=True)  # progress

            def on_result(r, g=g):  # each case's line as soon as it is timed
                nonlocal ok
                line, ratio = case_line(g.seed, r, old_peer, g.fields.get(r.case, ""))
                emit(line + tag)
                lines.append(line + tag)
                ratios.append((f"{g.label}/{r.case}", ratio))
                ok = ok and bool(r.compiled and r.correct)

            rows = bench.evaluate_peers(new, cases, replace(opts, heldout_seed=g.seed), [str(old), *peers], on_result)
            for c in cases:  # a case the run never reported (its child stopped): NA, counted, never left out
                if all(r.case != c.id for r in rows):
                    line = f"AB case={c.id} seed={g.label} NA: no row came back (the run stopped before it){tag}"
                    emit(line)
                    lines.append(line)
                    ratios.append((f"{g.label}/{c.id}", None))
                    ok = False
            if opts.record and rows:
                dicts = [r.model_dump(mode="json") for r in rows]
                first = first or dicts[0]
                p = panel.build(dicts, {c.id: c.kind for c in cases})
                backend = next((r.backend for r in rows if r.backend not in ("", "NA")), "tilelang")
                folder = Path(out) if out else paths.workspace() / "results" / backend / f"ab-{p.slug}-{p.date}"
                name = f"{g.label}-p{i}.csv" if processes > 1 else f"{g.label}.csv"
                for f in panel.write_results(rows, cases, paths.workspace(), folder / name):
                    print(f"wrote {paths.relative(f)}", file=sys.stderr, flush=True)
    tail: list[str] = []
    if processes > 1:
        tail, medians = spread_lines(ratios, processes)
        for line in tail:
            emit(line)
        last = f"{summary_line(medians)} PROCESSES:{processes} {spread_field(ratios)}"
    else:
        last = summary_line(ratios)
    emit(last)
    if folder is not None and first is not None:
        f = write_log(folder, new, old, groups, first, lines + tail + [last])
        print(f"wrote {paths.relative(f)}", file=sys.stderr, flush=True)
    return lines + tail + [last], ok


def write_log(folder: Path, new: Path, old: Path, groups: list[Group], row: dict, lines: list[str]) -> Path:
    """folder/ab.txt: what the run compared (both candidates' ids and files, the workspace's commit), where and when
    (a row's device, time and versions), the cases it timed and why (selection_lines), then every AB line and the
    summary, as printed: the run's whole record beside its CSVs."""
    from kopt import atomic, paths
    from kopt.candidate import candidate_id
    from kopt.store.vcs import head_short

    versions = ", ".join(f"{k} {v}" for k, v in sorted((row.get("versions") or {}).items()))
    head = [f"# kopt lab ab: {candidate_id(new)} ({paths.recorded(new)}) against {candidate_id(old)} "
            f"({paths.recorded(old)})",
            f"device {row.get('device', 'NA')}, {row.get('timestamp', 'NA')}, workspace commit "
            f"{head_short(paths.default_candidate().parent) or 'NA'}",
            f"versions: {versions or 'NA'}", ""]
    device = str(row.get("device", "NA"))
    return atomic.write_text(folder / "ab.txt", "\n".join(head + selection_lines(groups, device) + [""] + lines) + "\n")
