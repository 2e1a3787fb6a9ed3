"""`kopt bench`: the Signal. One machine line per case in --machine mode."""

from __future__ import annotations

import time
from typing import Optional

import typer

from kopt.cli import options
from kopt.cli.options import CaseSelection, VariantOpts, resolve_cases


def command(
    case: options.Case = None,
    all_: options.AllCases = False,
    candidate: options.Candidate = None,
    device: options.Device = "auto",
    cold_cache: bool = typer.Option(True, "--cold-cache/--warm-cache", help="Flush L2 before each timed call "
                                                                            "(default)."),
    flush: str = typer.Option("read", "--flush", help="Cold flush: read (a zeroed 2 x L2 buffer read; L2 left clean) | "
                                                      "zero (written, nvbench-style: the call pays the write-back)."),
    graph: bool = typer.Option(False, "--graph", help="Hot timing: CUDA-graph replay of many calls."),
    replay: str = typer.Option("graph", "--replay", help="Cold device-only calls: graph (each call replayed as a "
                                                         "CUDA graph captured from it, where candidate and baseline "
                                                         "both capture) | stream (kernels launched on the stream)."),
    dtype: Optional[str] = VariantOpts.dtype,
    head_dim: Optional[int] = VariantOpts.head_dim,
    page_size: Optional[int] = VariantOpts.page_size,
    seqlens: Optional[str] = VariantOpts.seqlens,
    heldout_seed: options.HeldoutSeed = None,
    heldout: options.HeldoutSize = None,
    machine: options.Machine = False,
    as_json: options.Json = False,
    no_record: bool = typer.Option(False, "--no-record", help="Do not append rows to candidates.jsonl."),
    timeout: float = typer.Option(600.0, "--timeout", min=1.0, help="Wall-clock limit per case, seconds."),
    seeds: int = typer.Option(1, "--seeds", min=1, max=16, help="Fresh-seed correctness trials per case."),
    timing_sets: Optional[int] = typer.Option(None, "--timing-sets", min=2, max=8,
                                              help="Input sets the timed calls rotate over, each its own allocation "
                                                   "(more average more placements in device memory; each costs the "
                                                   "case's bytes). Default 4 on a GPU, 2 on the CPU."),
    quick: bool = typer.Option(False, "--quick", help="Fewer timing samples (smoke runs; not for verdicts)."),
    baseline: str = typer.Option("auto", "--baseline", help="auto (flash-attn where it runs, else torch) | fa2 | "
                                                            "fa2-paged | fa3 | flashinfer | torch: a named peer is NA "
                                                            "where it cannot run, never replaced."),
    config: options.Config = None,
    model: Optional[str] = typer.Option(None, "--model", help="Bench a model of bench/workloads.yaml at your own "
                                                              "batch and lengths (`kopt workloads` lists them)."),
    shape: Optional[str] = typer.Option(None, "--shape", help="Bench your own heads and head dim: "
                                                              "QUERY_HEADS,KV_HEADS,HEAD_DIM (e.g. 28,4,128)."),
    batch: int = typer.Option(1, "--batch", help="With --model / --shape: sequences in the batch."),
    lengths: Optional[str] = typer.Option(None, "--lengths", help="With --model / --shape: N (all at N), a comma "
                                                                  "list, or uniform:MAX, lognormal:MAX[:SIGMA], "
                                                                  "fewlong:MAX[:EVERY]."),
    budget: Optional[float] = typer.Option(None, "--budget", min=1.0,
                                           help="Stop after SECONDS (wall time of the whole run): no case starts "
                                                "after it and the one running is stopped; a STOPPED line names the "
                                                "cases not run. Exit 1 only when a case that ran failed."),
    hidden: bool = typer.Option(False, "--hidden", help="Also check an unseen shape per case (batch+3, seqlen+13, "
                                                        "ragged; untimed)."),
) -> None:
    """Compile, check and time a candidate against flash_attn_with_kvcache on one or more cases."""
    from kopt.baselines import BASELINE_CHOICES
    from kopt.cli.output import deadline, emit_results
    from kopt.eval.bench import BenchOptions, evaluate
    from kopt.paths import default_candidate
    from kopt.records import FLUSH_KINDS, REPLAYS
    from kopt.store import resolve_candidate as resolve

    t0 = time.perf_counter()
    options.output_mode(machine, as_json)
    if model or shape:
        cases = [_custom(model, shape, batch, lengths, page_size, dtype, head_dim, seqlens, case, all_)]
    else:
        cases = resolve_cases(CaseSelection(case, all_), dtype, head_dim, page_size, seqlens, heldout, heldout_seed,
                              device)
    path = resolve(candidate or default_candidate())
    opts = BenchOptions(device=device, cold=cold_cache, flush=options.choice(flush, FLUSH_KINDS, "--flush"),
                        graph=graph, replay=options.choice(replay, REPLAYS, "--replay"), timeout_s=timeout,
                        record=not no_record, seeds=seeds, timing_sets=timing_sets, quick=quick,
                        baseline=options.choice(baseline, BASELINE_CHOICES, "--baseline"),
                        config=options.config_for(config, path), hidden=hidden, deadline=deadline(budget, t0),
                        heldout_seed=heldout_seed)

    def go(on_result, on_progress):
        opts.progress = on_progress
        return evaluate(path, cases, opts, on_result=on_result)

    results = emit_results(go, machine, as_json, total=len(cases), wall_start=t0, cases=cases, budget=budget)
    if not all(r.compiled and r.correct for r in results):
        raise typer.Exit(1)


def _custom(model, shape, batch, lengths, page_size, dtype, head_dim, seqlens, case, all_):
    """The case of --model / --shape (usage errors name the flag at fault)."""
    from kopt import workloads
    from kopt.errors import UsageError

    if model and shape:
        raise UsageError("--model and --shape are exclusive")
    if case or all_:
        raise UsageError("--model / --shape bench one shape of their own: leave out --case and --all")
    if head_dim is not None or seqlens is not None:
        raise UsageError("--head-dim and --seqlens come from --model / --shape and --lengths")
    if not lengths:
        raise UsageError("--model / --shape need --lengths (e.g. --lengths 2048 or --lengths uniform:32768)")
    m = workloads.load().model(model) if model else workloads.parse_shape(shape)
    return workloads.custom_case(m, batch, lengths, page_size, dtype or "fp16")
