"""`kopt e2e --model NAME`: the candidate as the decode attention of a real transformers decoder. One E2E line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from kopt.cli import options


def command(
    model: str = typer.Option(..., "--model", help="A model of bench/workloads.yaml (`kopt workloads` lists them): "
                                                   "its heads and head dim make the decoder's attention."),
    layers: Optional[int] = typer.Option(None, "--layers", help="Decoder layers (default 2 on a CPU, 22 on CUDA)."),
    batch: Optional[int] = typer.Option(None, "--batch", help="Sequences decoded together (default 2 CPU, 1 CUDA)."),
    prompt_len: Optional[int] = typer.Option(None, "--prompt-len", help="Seeded prompt tokens per sequence, "
                                                                        "prefilled with the library's own attention "
                                                                        "(default 32 CPU, 1536 CUDA)."),
    tokens: Optional[int] = typer.Option(None, "--tokens", help="Tokens decoded greedily (default 8 CPU, 64 CUDA)."),
    page_size: Optional[int] = typer.Option(None, "--page-size", help="The candidate's cache in pages of 16 | 32 | "
                                                                      "64 | 256 tokens; 0 or none: contiguous."),
    dtype: str = typer.Option("bf16", "--dtype", help="fp16 | bf16."),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed of the weights and the prompt."),
    fit_steps: int = typer.Option(0, "--fit-steps", min=0, help="Fit the random decoder this many steps to continue "
                                                                 "a repeated block (copying through attention) "
                                                                 "before it decodes, so that its greedy tokens are "
                                                                 "decisive; the prompt repeats a block too. 0: "
                                                                 "random weights, random prompt. A fitted decoder "
                                                                 "is kept for the next run of the same fit "
                                                                 "($KOPT_FIT_CACHE; 0: off)."),
    candidate: options.Candidate = None,
    device: options.Device = "auto",
    no_graph: bool = typer.Option(False, "--no-graph", help="On CUDA, run the decode steps eagerly instead of "
                                                            "replaying a captured CUDA graph."),
    machine: options.Machine = False,
    as_json: options.Json = False,
    out: Optional[Path] = typer.Option(None, "--out", help="Also append the result (one JSON object) to this file."),
    no_record: bool = typer.Option(False, "--no-record", help="Do not append the row to candidates.jsonl."),
    timeout: float = typer.Option(600.0, "--timeout", min=1.0, help="Wall-clock limit of the run, seconds."),
) -> None:
    """Decode N tokens greedily with the baseline and with the candidate as the decode attention of a Llama decoder
    (random weights): tokens the same, logit gaps (kopt's tolerance rule), step latency, attention share."""
    from kopt import e2e
    from kopt.cli.common import err_console
    from kopt.paths import default_candidate
    from kopt.store import resolve_candidate as resolve

    o = e2e.options(model, device, layers=layers, batch=batch, prompt_len=prompt_len, tokens=tokens,
                    page_size=page_size, dtype=options.choice(dtype, ("fp16", "bf16"), "--dtype"), seed=seed,
                    graph=not no_graph, fit_steps=fit_steps)
    path = resolve(candidate or default_candidate())
    if not machine and not as_json:
        err_console().print(f"[dim]kopt e2e: {o.model} x{o.layers} layers, batch {o.batch}, prompt {o.prompt_len}, "
                            f"{o.tokens} tokens on {o.device}"
                            f"{f', fitted {o.fit_steps} steps first' if o.fit_steps else ''}...[/dim]")
    res = e2e.run(path, o, timeout)
    if not no_record:
        e2e.record(res)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "a") as fh:
            fh.write(res.model_dump_json() + "\n")
    if as_json:
        print(json.dumps(res.model_dump(mode="json")))
    else:
        if not machine:
            _summary(res)
        print(res.line(), flush=True)
    if not res.passed:
        raise typer.Exit(1)


def _summary(res) -> None:
    from kopt.cli.common import err_console
    from kopt.records import fmt_na

    c = err_console()
    t, r = res.timing, res.ref_timing
    c.print(f"{'PASS' if res.passed else 'FAIL'} {res.message}".rstrip())
    c.print(f"decoder {res.dims}; baseline {res.ref}; transformers {res.transformers}")
    c.print(f"step {fmt_na(t.median_ms if t else None)} ms vs {fmt_na(r.median_ms if r else None)} ms "
            f"({fmt_na(res.step_speedup, '{:.3f}x')}), attention {fmt_na(res.attn_share, '{:.1%}')} of the step "
            f"(baseline's {fmt_na(res.ref_attn_share, '{:.1%}')})")
