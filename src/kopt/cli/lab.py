"""`kopt lab ...`: research tools over kopt's public faces (kopt.lab): screens, timelines, read bounds, prewarm,
export, the FlashInfer check and GPU campaigns. Every input is checked before any GPU work."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(help="Research tools: config screens, kernel timelines, read bounds, prewarm, the bench CSV, the "
                       "FlashInfer check, GPU campaigns, the GPU test matrix in shards.", no_args_is_help=True)

_CASE = "Case ids: 10,14 or 4-18."
_CANDIDATE = "Candidate file (default: the shipped solution/tilelang/run_kernel.py)."
_SEED = "A held-out draw's seed (a verdict's HELDOUT_SEED): case ids past 1000 are its shapes."
_HELDOUT = "With --heldout-seed: the draw's size (default: the case file's verify.heldout)."


def _cases(case: str, page_size: Optional[int] = None, heldout: Optional[int] = None,
           seed: Optional[int] = None) -> list:
    """The lab's cases: ids of the case file and, with a seed, of its held-out draw (usage errors before any GPU)."""
    from kopt.cli.options import heldout_size
    from kopt.lab import pick_cases

    return pick_cases(case, page_size, heldout=heldout_size(heldout, seed), seed=seed)


def _say(line: str) -> None:
    print(line, flush=True)


def _configs(text: str, candidate: Optional[Path], labelled: bool = True):
    """(candidate path, configs) with every config key checked against the candidate's, before any work."""
    from kopt.candidate import config_keys
    from kopt.lab import candidate_path, check_keys, parse_configs

    path = candidate_path(candidate)
    cfgs = parse_configs(text, labelled)
    check_keys(cfgs, config_keys(path))
    return path, cfgs


@app.command("screen")
def screen(
    case: str = typer.Option(..., "--case", "-c", help=_CASE),
    configs: str = typer.Option(..., "--configs", help="';'-separated label=JSON, each paired with the case's own "
                                                       "plan; label=+JSON lays the config over that plan."),
    page_size: Optional[int] = typer.Option(None, "--page-size", help="The cases in pages of 16 | 32 | 64 | 256 (0: "
                                                                      "contiguous; default: each case's own layout)."),
    quick: bool = typer.Option(False, "--quick", help="Fewer timing samples (a dev screen, not a result)."),
    hang_s: float = typer.Option(240.0, "--hang-s", min=1.0, help="A config's limit (check + timing), seconds; past "
                                                                  "it the screen prints HUNG and exits 3."),
    candidate: Optional[Path] = typer.Option(None, "--candidate", help=_CANDIDATE),
    heldout_seed: Optional[int] = typer.Option(None, "--heldout-seed", min=0, help=_SEED),
    heldout: Optional[int] = typer.Option(None, "--heldout", min=1, max=256, help=_HELDOUT),
) -> None:
    """Pair kernel configs against the candidate's own plan, case by case, in one process (GPU)."""
    from kopt.lab import require_cuda, run_screen

    path, cfgs = _configs(configs, candidate)
    cases = _cases(case, page_size, heldout, heldout_seed)
    require_cuda("kopt lab screen")
    run_screen(path, cases, cfgs, quick=quick, hang_s=hang_s, emit=_say)


@app.command("timeline")
def timeline(
    case: str = typer.Option("10", "--case", "-c", help=_CASE),
    configs: Optional[str] = typer.Option(None, "--configs", help="';'-separated label=JSON timed in place beside "
                                                                  "the plan (label=+JSON: laid over it); default "
                                                                  "lastcta=+{\"last_cta\": 1}; '' for none."),
    calls: int = typer.Option(400, "--calls", help="Calls a timeline (at least 20)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Also write the table (markdown) here."),
    candidate: Optional[Path] = typer.Option(None, "--candidate", help=_CANDIDATE),
    heldout_seed: Optional[int] = typer.Option(None, "--heldout-seed", min=0, help=_SEED),
    heldout: Optional[int] = typer.Option(None, "--heldout", min=1, max=256, help=_HELDOUT),
) -> None:
    """Where a cold call's time goes between its kernels: each kernel's start and end (GPU, CUPTI)."""
    from kopt.errors import UsageError
    from kopt.lab import TIMELINE_CONFIGS, TIMELINE_MIN_CALLS, require_cuda, run_timeline, write_table

    if calls < TIMELINE_MIN_CALLS:
        raise UsageError(f"--calls must be at least {TIMELINE_MIN_CALLS}, got {calls}")
    path, cfgs = _configs(TIMELINE_CONFIGS if configs is None else configs, candidate)
    cases = _cases(case, heldout=heldout, seed=heldout_seed)
    require_cuda("kopt lab timeline")
    write_table(out, run_timeline(path, cases, cfgs, calls, emit=_say))


@app.command("readbound")
def readbound(
    case: Optional[str] = typer.Option(None, "--case", "-c", help="Case ids: 10,14 or 4-18 (default: 4-18; with "
                                                                  "--heldout-seed, the whole draw)."),
    layouts: Optional[str] = typer.Option(None, "--layouts", help="Page sizes, 0 = contiguous (e.g. 0,16,256): each "
                                                                  "case's valid keys read per layout instead."),
    out: Optional[Path] = typer.Option(None, "--out", help="Also write the table (markdown) here."),
    candidate: Optional[Path] = typer.Option(None, "--candidate", help=_CANDIDATE),
    heldout_seed: Optional[int] = typer.Option(None, "--heldout-seed", min=0, help=_SEED + " The table ends with "
                                                                                         "their geomean."),
    heldout: Optional[int] = typer.Option(None, "--heldout", min=1, max=256, help=_HELDOUT),
) -> None:
    """The fastest pure read of each case's bytes, paired with the candidate: what the case can reach (GPU)."""
    from kopt.cli.options import heldout_size
    from kopt.errors import UsageError
    from kopt.lab import candidate_path, pick_cases, read_layouts, require_cuda, run_readbound, write_table
    from kopt.workloads import draw_ids

    sizes: list[int] = []
    if layouts is not None:
        try:
            sizes = [int(x) for x in layouts.split(",")]
        except ValueError:
            sizes = [-1]
        if not sizes or any(s not in (0, 16, 32, 64, 256) for s in sizes):
            raise UsageError(f"--layouts takes page sizes of 0, 16, 32, 64, 256 like 0,16,256, got {layouts!r}")
    n_held = heldout_size(heldout, heldout_seed)
    if case is None:
        case = draw_ids(n_held) if n_held else "4-18"
    path = candidate_path(candidate)
    cases = pick_cases(case, heldout=n_held, seed=heldout_seed)
    require_cuda("kopt lab readbound")
    lines = read_layouts(path, cases, sizes, emit=_say) if sizes else \
        run_readbound(path, cases, emit=_say, seed=heldout_seed)
    write_table(out, lines)


@app.command("ab")
def ab(
    candidate: Path = typer.Option(..., "--candidate", help="The new candidate file, REV:PATH.py (a commit's or "
                                                            "branch's), or CHANGE.patch (the shipped candidate "
                                                            "with that git diff applied, to a copy)."),
    against: Path = typer.Option(..., "--against", help="The old candidate (file, REV:PATH.py or "
                                                        "CHANGE.patch), timed as a peer."),
    case: Optional[str] = typer.Option(None, "--case", "-c", help="Named case ids to consider: 10,14 or 4-18 "
                                                                  "(default: every named case, or none with "
                                                                  "--seeds)."),
    seeds: Optional[str] = typer.Option(None, "--seeds", help="Held-out draws to consider, by seed: 20261206,20261207 "
                                                              "(a verdict's HELDOUT_SEED)."),
    heldout: Optional[int] = typer.Option(None, "--heldout", min=1, max=256, help="The draws' size (default: the case "
                                                                                  "file's verify.heldout)."),
    plan_for: Optional[str] = typer.Option(None, "--plan-for", help="Whose plans decide what changed: a device of "
                                                                    "hardware.yaml (default: this host's GPU)."),
    kernel: Optional[str] = typer.Option(None, "--kernel", help="A change to this kernel's code that moves no plan "
                                                                "(e.g. decode_balanced, or decode_direct,"
                                                                "decode_split_combine): the cases whose plans run "
                                                                "it are timed too."),
    lowered: bool = typer.Option(False, "--lowered", help="A change to kernel code: also the cases whose kernels the "
                                                          "two candidates lower to different CUDA for the device's "
                                                          "arch (their lower_plan hooks, no GPU; seconds a kernel on "
                                                          "this host), marked lowered."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only list the cases that change and the plan fields that "
                                                          "move (no GPU)."),
    registers: bool = typer.Option(False, "--registers", help="In the list, each case's kernel of both candidates "
                                                              "compiled for the device's arch (nvcc, no GPU): "
                                                              "registers and CTAs a unit, old -> new."),
    peers: Optional[str] = typer.Option(None, "--peers", help="Also time these peers (e.g. fa2)."),
    quick: bool = typer.Option(False, "--quick", help="Fewer timing samples (a dev screen, not a result)."),
    no_record: bool = typer.Option(False, "--no-record", help="No ledger rows, no files under results/."),
    out: Optional[Path] = typer.Option(None, "--out", help="Folder of the CSVs and tables, one per group (default "
                                                           "results/<backend>/ab-<device>-<date>/)."),
    timeout: float = typer.Option(600.0, "--timeout", min=1.0, help="Wall-clock limit per case, seconds."),
    save_selection: Optional[Path] = typer.Option(None, "--save-selection", help="Also write the cases to time (and "
                                                                                 "why) to this JSON file, for a later "
                                                                                 "run's --selection."),
    selection: Optional[Path] = typer.Option(None, "--selection", help="Time the cases a --save-selection file lists "
                                                                       "instead of selecting again (no lowering on "
                                                                       "the GPU host); it must name this run's "
                                                                       "candidates and device."),
    processes: int = typer.Option(1, "--processes", min=1, max=16, help="Time every group this many times, each "
                                                                        "in a new child process: a line a case "
                                                                        "over them (median, min, max) and SPREAD "
                                                                        "in the summary. A kernel can run at two "
                                                                        "speeds from one process to the next."),
) -> None:
    """The A/B of a kernel change on the cases it touches: the named cases and held-out draws whose plans the two
    candidates resolve differently, each timed paired against the old candidate (GPU); one AB line each, then a
    summary line (new over old: above 1 the new candidate is faster)."""
    from kopt.cases import load_cases
    from kopt.cli.options import heldout_size
    from kopt.errors import UsageError
    from kopt.eval import BenchOptions
    from kopt.eval.peers import check_names
    from kopt.lab import (
        AbGroup,
        ab_registers,
        ab_select,
        ab_selection_lines,
        load_ab_selection,
        pick_cases,
        require_cuda,
        run_ab,
        save_ab_selection,
    )
    from kopt.store import resolve_candidate as resolve
    from kopt.workloads import draw_ids

    try:
        seed_list = [int(s) for s in seeds.split(",")] if seeds else []
    except ValueError:
        raise UsageError(f"--seeds takes seeds like 20261206,20261207, got {seeds!r}") from None
    if any(s < 0 for s in seed_list):
        raise UsageError(f"--seeds are not negative, got {seeds!r}")
    new, old = resolve(candidate), resolve(against)
    extra = check_names([p.strip() for p in peers.split(",")]) if peers else []
    if any(p.endswith(".py") for p in extra):
        raise UsageError("--peers takes named peers (e.g. fa2); the old candidate is --against")
    if not dry_run:
        require_cuda("kopt lab ab", "--dry-run lists the cases that change on any machine")
    if plan_for is None:
        if dry_run:
            raise UsageError("--dry-run needs --plan-for DEVICE (a device of hardware.yaml, e.g. H200)")
        from kopt.eval import device_profile

        plan_for = device_profile()["name"]
    if save_selection is not None and not save_selection.parent.is_dir():
        raise UsageError(f"--save-selection {save_selection}: no folder {save_selection.parent}")
    lowerings: dict = {}  # one lowering a kernel for --lowered and --registers
    if selection is not None:
        chosen = [o for o, v in (("--case", case), ("--seeds", seeds), ("--heldout", heldout), ("--kernel", kernel),
                                 ("--lowered", lowered or None), ("--save-selection", save_selection)) if v is not None]
        if chosen:
            raise UsageError(f"--selection already decides the cases: drop {', '.join(chosen)}")
        groups = load_ab_selection(selection, plan_for, new, old)
    else:
        n_held = heldout_size(heldout, seed_list[0] if seed_list else None)
        groups = [AbGroup(None, pick_cases(case or ",".join(str(c.id) for c in load_cases())))] \
            if case or not seed_list else []
        groups += [AbGroup(s, pick_cases(draw_ids(n_held), heldout=n_held, seed=s)) for s in seed_list]
        groups = ab_select(new, old, groups, plan_for, kernel, lowered, lowerings)
        seen = sorted({k for g in groups for ks in g.kernels.values() for k in ks})
        for k in (kernel.split(",") if kernel is not None else []):
            if k not in seen:
                raise UsageError(f"--kernel {k}: no case considered here runs it on {plan_for}; their plans run "
                                 f"{', '.join(seen) or 'no kernel'}")
        if save_selection is not None:
            save_ab_selection(save_selection, groups, plan_for, new, old, n_held)
    res = ab_registers(new, old, groups, plan_for, lowerings) if registers else None
    for line in ab_selection_lines(groups, plan_for, res):
        _say(line)
    if dry_run:
        return
    opts = BenchOptions(device="cuda", timeout_s=timeout, record=not no_record, quick=quick)
    _, ok = run_ab(new, old, groups, opts, extra, out, _say, processes)
    if not ok:
        raise typer.Exit(1)


@app.command("prewarm")
def prewarm(
    jobs: int = typer.Option(0, "--jobs", min=0, help="Worker processes (default: the CPUs less two, at least one)."),
    list_only: bool = typer.Option(False, "--list", help="Print the kernels and exit (no GPU needed with "
                                                         "--device-profile)."),
    configs: str = typer.Option("", "--configs", help="';'-separated JSON configs, each compiled for the named cases "
                                                      "too ('+JSON': laid over each case's own plan)."),
    case: Optional[str] = typer.Option(None, "--case", "-c", help="Only these cases (fp16 as the case file has "
                                                                  "them): a screen's kernels."),
    page_size: int = typer.Option(0, "--page-size", help="With --case: those cases in pages of this size."),
    verify: bool = typer.Option(False, "--verify", help="Only what `bench --all` and `verify` need."),
    bf16: bool = typer.Option(False, "--bf16", help="With --verify: every case in bf16 too (kopt peers --dtype bf16)."),
    heldout_seed: Optional[int] = typer.Option(None, "--heldout-seed", min=0, help="With --verify: also the held-out "
                                                                                    "draws of this seed."),
    heldout: int = typer.Option(0, "--heldout", min=0, max=256, help="With --heldout-seed: how many draws (default: "
                                                                     "the case file's verify.heldout)."),
    device_profile: Optional[str] = typer.Option(None, "--device-profile", help="The plans of this hardware.yaml "
                                                                                "device (e.g. H200), on a host with "
                                                                                "no GPU: listed with --list, else "
                                                                                "compiled for it (the candidate's "
                                                                                "build_plan)."),
    candidate: Optional[Path] = typer.Option(None, "--candidate", help=_CANDIDATE),
) -> None:
    """Compile every kernel a GPU run will need, in parallel, into TileLang's disk cache."""
    from kopt.cases import parse_ids
    from kopt.errors import UsageError
    from kopt.eval import compile_all, default_jobs
    from kopt.eval import device_profile as profile_of
    from kopt.lab import pick_cases, prewarm_plan, require_cuda

    for bad, why in ((bf16 and not verify, "--bf16 goes with --verify"),
                     (heldout_seed is not None and not verify, "--heldout-seed goes with --verify"),
                     (heldout and heldout_seed is None, "--heldout goes with --heldout-seed"),
                     (verify and case, "--verify and --case are exclusive"),
                     (page_size and not case, "--page-size goes with --case")):
        if bad:
            raise UsageError(why)
    path, extra = _configs(configs, candidate, labelled=False)
    ids = parse_ids(case)
    if ids:
        pick_cases(case, page_size)  # unknown ids and page sizes: usage errors here
    if device_profile is None:
        require_cuda("kopt lab prewarm", "--device-profile NAME lists or compiles the kernels without one")
    gpu_less = device_profile is not None and not list_only
    profile = profile_of(device_profile)
    if gpu_less and str(profile.get("vendor", "")).lower() != "nvidia":
        raise UsageError(f"--device-profile {device_profile} without --list: compiling with no GPU is for NVIDIA "
                         "devices (nvcc); --list shows its plans")
    todo = prewarm_plan(path, profile, ids, page_size, verify, bf16, heldout, heldout_seed, extra, gpu_less)
    if list_only:
        for k in todo:
            _say(k.label + (f"  FAILED {k.error}" if k.error else ""))
        _say(f"{len(todo)} kernels")
        return
    if compile_all(path, todo, jobs or default_jobs(), emit=_say, profile=profile if gpu_less else None):
        raise typer.Exit(1)


@app.command("export")
def export(
    run_ids: list[str] = typer.Argument(..., help="run_ids of the ledger, space- or comma-separated (a prefix is "
                                                  "enough; `kopt candidates --json` lists them)."),
    ledger: Optional[Path] = typer.Option(None, "--ledger", help="The ledger (default: the workspace's "
                                                                 "candidates.jsonl)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write here (default: stdout)."),
    markdown: bool = typer.Option(False, "--markdown", help="The README table (paged against contiguous), not CSV."),
) -> None:
    """The rows of `kopt bench` runs as the committed bench CSV (results/<backend>/bench-<device>-<date>.csv)."""
    import sys

    from kopt import atomic, paths
    from kopt.lab import export_csv, export_markdown, export_rows, ragged_names

    ids = [r.strip() for arg in run_ids for r in arg.split(",") if r.strip()]
    rows = export_rows(ledger or paths.ledger_file(), ids,
                       warn=lambda w: print(f"kopt: warning: {w}", file=sys.stderr))
    text = export_markdown(rows, ragged_names()) if markdown else export_csv(rows)
    if out:
        atomic.write_text(out, text)
    else:
        sys.stdout.write(text)


@app.command("flashinfer")
def flashinfer() -> None:
    """Check the `flashinfer` peer on a GPU: outputs against the reference, and under CUDA-graph replay."""
    from kopt.lab import check_flashinfer, require_cuda

    require_cuda("kopt lab flashinfer")
    if check_flashinfer(emit=_say):
        raise typer.Exit(1)


@app.command("flashinfer-build")
def flashinfer_build(
    wheel: Optional[Path] = typer.Option(None, "--wheel", help="The pinned flashinfer-python wheel to take FlashInfer "
                                                               "from (default: pip download it)."),
    src: Optional[Path] = typer.Option(None, "--src", help="The trimmed source tarball an earlier build wrote (for a "
                                                           "host without network)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Where the library goes (default .gpu-fi/ here)."),
    build_dir: Optional[Path] = typer.Option(None, "--build-dir",
                                             help="Scratch folder (default build/flashinfer-capi)."),
    jobs: int = typer.Option(0, "--jobs", min=0, help="Parallel nvcc jobs (default min(5, cores))."),
    no_src_tarball: bool = typer.Option(False, "--no-src-tarball", help="Do not write the trimmed source tarball."),
) -> None:
    """Build kopt's C library of FlashInfer's batch decode (its own kernels, sm_90a) for the `flashinfer` peer:
    nvcc and a C++17 compiler, no GPU (results/peers-flashinfer.md says what is taken and how)."""
    from kopt.lab import build_flashinfer

    rc = build_flashinfer(wheel, src, out, build_dir, jobs, not no_src_tarball)
    if rc:
        raise typer.Exit(rc)


def check_steps(steps) -> None:
    """Each `kopt` step's arguments parsed by kopt's own commands, none run: an unknown command or option, or a value
    of the wrong type, is a usage error naming the step, before anything starts."""
    import shlex

    from kopt.cli.main import app as kopt_app
    from kopt.errors import UsageError

    for s in steps:
        words = shlex.split(s.run)
        if words[0] != "kopt":
            continue
        cmd, ctx, name, rest = typer.main.get_command(kopt_app), None, "kopt", words[1:]
        try:
            while hasattr(cmd, "get_command"):  # a group: its subcommand by name
                ctx = cmd.make_context(name, [], parent=ctx, resilient_parsing=True)
                said = " ".join(words[:len(words) - len(rest)])
                if not rest:
                    raise UsageError(f"`{said}` needs a command")
                if (sub := cmd.get_command(ctx, rest[0])) is None:
                    raise UsageError(f"no such command: {said} {rest[0]}")
                cmd, name, rest = sub, rest[0], rest[1:]
            cmd.make_context(name, rest, parent=ctx)
        except UsageError as e:
            raise UsageError(f"step {s.name}: {e}") from None
        except Exception as e:  # click's usage errors, by shape (the copy typer vendors, or click itself)
            if not hasattr(e, "format_message"):
                raise
            raise UsageError(f"step {s.name}: {e.format_message()} ({s.run})") from None


def _matrix_facts() -> dict:
    """Where a test matrix ran: the device (kopt.hardware's name for it: the driver's, or cpu), the date, the
    workspace's commit and the shipped candidate's id."""
    from datetime import datetime, timezone

    from kopt import hardware, paths
    from kopt.candidate import candidate_id
    from kopt.store import head_short

    ws = paths.workspace()
    shipped = paths.default_candidate()
    return {"device": hardware.detect(hardware.resolve_device("auto")).raw_name,
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
            "commit": head_short(ws) or "NA", "candidate": candidate_id(shipped) if shipped.is_file() else "NA"}


@app.command("gpu-tests")
def gpu_tests(
    paths_: Optional[list[str]] = typer.Argument(None, metavar="[PATHS]...", help="Test files or folders, from here "
                                                                                  "(default: tests/gpu)."),
    shards: int = typer.Option(12, "--shards", help="pytest processes side by side (the tests dealt round-robin)."),
    marker: str = typer.Option("gpu", "--marker", "-m", help="Only tests with this pytest marker ('' for all)."),
    keyword: str = typer.Option("", "--keyword", "-k", help="Only tests matching this pytest -k expression."),
    timeout: float = typer.Option(1800.0, "--timeout", min=1.0, help="Seconds a shard (or the rerun) may run."),
    budget: Optional[float] = typer.Option(None, "--budget", min=1.0, help="Seconds for the whole run: the rerun "
                                                                           "stops there too, so the record is "
                                                                           "written within it."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the record here (e.g. "
                                                           "results/tilelang/gpu-tests-<device>-<date>-<what>.txt)."),
) -> None:
    """The GPU test matrix in shards side by side, then its failures alone: a progress line a shard, one record
    (--out) and one GPU_TESTS line; exit 1 when a test still fails after the rerun, or when every test skipped
    (GPU_TESTS:NA: nothing was tested, as on a host without a GPU)."""
    from kopt import atomic
    from kopt.errors import UsageError
    from kopt.lab import gpu_tests_record, run_gpu_tests
    from kopt.proc import reaping

    targets = paths_ or ["tests/gpu"]
    missing = [t for t in targets if not Path(t.split("::")[0]).exists()]
    if missing:
        raise UsageError(f"no such test path: {', '.join(missing)}")
    if out is not None and not out.parent.is_dir():
        raise UsageError(f"--out {out}: its folder does not exist")
    with reaping():  # Ctrl-C or SIGTERM: the shards' process groups end with this one
        res = run_gpu_tests(targets, shards, Path.cwd(), marker=marker, keyword=keyword, timeout_s=timeout,
                            emit=_say, budget_s=budget)
    if out is not None:
        atomic.write_text(out, gpu_tests_record(res, targets, marker, keyword, _matrix_facts()))
        _say(f"wrote {out}")
    if res.status == "NA":
        _say(f"no test ran: all {res.final.skipped} skipped (a GPU test skips on a host without one)")
    _say(res.line())
    if res.status != "pass":
        raise typer.Exit(1)


@app.command("campaign")
def campaign(
    file: Path = typer.Argument(..., help="The campaign: a YAML file of named steps (workflows/campaign-h200.yaml)."),
    steps: Optional[str] = typer.Option(None, "--steps", help="Only these steps, comma-separated (in the file's "
                                                              "order)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print each step's command; run nothing."),
    out: Optional[Path] = typer.Option(None, "--out", help="Logs and campaign.tgz here (default: "
                                                           "campaign-out/<file name> in the workspace)."),
    budget: Optional[float] = typer.Option(None, "--budget", min=1.0, help="Overall budget, seconds (default: the "
                                                                           "file's budget_s): later steps skipped."),
    pack_only: bool = typer.Option(False, "--pack-only", help="Leave only campaign.tgz and steps.txt in --out."),
) -> None:
    """Run a GPU campaign: each step in order, a log each, every failure a line; packed for `kopt import`."""
    from kopt import paths
    from kopt.errors import UsageError
    from kopt.lab import campaign_summary, load_campaign, run_campaign, select_steps
    from kopt.lab import dry_run as plan_lines

    names = None if steps is None else [s.strip() for s in steps.split(",") if s.strip()]
    if names == []:
        raise UsageError("--steps names no step (give names like doctor,bench)")
    cf = load_campaign(file)
    chosen = select_steps(cf, names)
    check_steps(chosen)
    if dry_run:
        for line in plan_lines(chosen):
            _say(line)
        return
    ws = paths.workspace()
    res = run_campaign(cf, chosen, (out or ws / "campaign-out" / file.stem).resolve(), ws, paths.relative(file),
                       budget_s=budget, pack_only=pack_only, emit=_say)
    _say(campaign_summary(res))
    if not res.ok:
        raise typer.Exit(1)
