"""Options shared by the commands, defined once: case selection, candidate, device, output mode, the
variant knobs, and the checks of their values (one-line usage errors)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer

from kopt.errors import UsageError

#: --case N | 1,4-6 (the cases of bench/cases.yaml a command runs).
Case = Annotated[Optional[str], typer.Option("--case", "-c", help="Case ids: 10, or 1,4-6.")]
#: --all: every case.
AllCases = Annotated[bool, typer.Option("--all", help="Every case of bench/cases.yaml.")]
#: --case N: one case (profile, candidates); the same text as --case, one id.
OneCase = Annotated[Optional[str], typer.Option("--case", "-c", help="One case id, e.g. 10.")]
#: --candidate PATH (default: the workspace's solution/tilelang/run_kernel.py).
Candidate = Annotated[Optional[Path], typer.Option(
    "--candidate", help="Candidate file (default solution/tilelang/run_kernel.py); REV:PATH.py: the file as a "
                        "commit or branch of the workspace's repository holds it; or CHANGE.patch: the shipped "
                        "candidate with that git diff applied (to a copy).")]
#: --device auto | cuda | cpu.
Device = Annotated[str, typer.Option("--device", help="auto | cuda | cpu.")]
#: --json: one JSON object on stdout instead of the human output.
Json = Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")]
#: --machine: only machine lines on stdout.
Machine = Annotated[bool, typer.Option("--machine", help="Only machine lines on stdout; logs on stderr.")]
#: --config JSON passed to run(config=...).
Config = Annotated[Optional[str], typer.Option(
    "--config", help="JSON object passed to run(config=...); its keys are checked against the candidate's "
                     "declared ones (CONFIG_KEYS / _CFG_KEYS) before any work.")]
#: --heldout-seed S: the ids past 1000 of --case are that seed's held-out draws, as `kopt verify` numbered them.
HeldoutSeed = Annotated[Optional[int], typer.Option(
    "--heldout-seed", min=0, help="A verdict's held-out draw seed: --case then takes its ids too (1001, 1002, ...).")]
#: --heldout N: the size of that draw (a draw of N is not the first N of a larger one).
HeldoutSize = Annotated[Optional[int], typer.Option(
    "--heldout", min=1, max=256, help="With --heldout-seed: the draw's size, as the verdict drew it (kopt verify "
                                      "--heldout; default: verify.heldout of bench/cases.yaml, 12).")]


def heldout_size(heldout: Optional[int], heldout_seed: Optional[int]) -> int:
    """The held-out draw's size for --heldout / --heldout-seed: --heldout alone is a usage error; without a seed 0 (no
    draw, and the case file is not read for it); by default the case file's verify.heldout."""
    if heldout is not None and heldout_seed is None:
        raise UsageError("--heldout goes with --heldout-seed (the draw's size and its seed)")
    if heldout_seed is None:
        return 0
    if heldout is not None:
        return heldout
    from kopt.cases import load_file

    return load_file().verify.heldout


class VariantOpts:
    """Reusable typer options for the variant knobs (validated by kopt.cases.Variant)."""

    dtype = typer.Option(None, "--dtype", help="fp16 | bf16 (default from bench/cases.yaml).")
    head_dim = typer.Option(None, "--head-dim", help="64 | 128.")
    page_size = typer.Option(None, "--page-size", help="16 | 32 | 64 | 256 for paged KV; 0 for contiguous.")
    seqlens = typer.Option(None, "--seqlens", help="full | ragged (seeded).")


class ExecutorOpts:
    """Where the shards of `kopt tune` / `kopt verify` run (kopt.executor)."""

    executor = typer.Option("local", "--executor",
                            help="local: this host (--gpus N spreads over its GPUs); ray: one Ray task per shard on "
                                 "an existing cluster (needs the ray extra).")
    ray_address = typer.Option(None, "--ray-address",
                               help="With --executor ray: the cluster's host:port (what `ray start --head` prints); "
                                    "default $RAY_ADDRESS or the cluster started on this host.")
    ray_shared = typer.Option(False, "--ray-shared",
                              help="With --executor ray: every node sees this workspace at the same path, so only kopt "
                                   "is shipped (default: the workspace goes to each node as the job's working_dir).")


@dataclass
class CaseSelection:
    """--case text and --all flag."""

    case: Optional[str]
    all_: bool


def resolve_cases(sel: CaseSelection, dtype=None, head_dim=None, page_size=None, seqlens=None,
                  heldout: Optional[int] = None, heldout_seed: Optional[int] = None, device: str = "auto"):
    """Load bench/cases.yaml, select cases (ids past 1000: the held-out draw of --heldout-seed and --heldout
    (heldout_size), cut to CPU size when `device` is the CPU, as a CPU verdict cuts it), apply variant overrides
    (errors are one-line usage errors)."""
    from kopt import workloads
    from kopt.cases import load_cases, parse_ids

    if not sel.case and not sel.all_:
        raise UsageError("choose cases with --case N (e.g. --case 10 or --case 1,4-6) or --all")
    if sel.case and sel.all_:
        raise UsageError("--case and --all are exclusive")
    from kopt.hardware import resolve_device

    n_held = heldout_size(heldout, heldout_seed)
    cpu = heldout_seed is not None and resolve_device(device) == "cpu"  # resolved only for a draw
    ids = parse_ids(sel.case)
    cases = workloads.pick(load_cases(), ids, n_held, heldout_seed, cpu) if ids else load_cases()
    return [c.with_variant(dtype=dtype, head_dim=head_dim, page_size=page_size, seqlens=seqlens) for c in cases]


def choice(v: str, allowed: tuple, flag: str) -> str:
    """v when it is one of `allowed`, else a usage error naming the flag."""
    if v not in allowed:
        raise UsageError(f"{flag} must be one of {', '.join(allowed)} (got {v!r})")
    return v


def config_json(text: Optional[str]) -> Optional[dict]:
    """The --config text as a dict (None when absent); not a JSON object is a usage error."""
    if text is None:
        return None
    try:
        v = json.loads(text)
    except ValueError:
        raise UsageError(f"--config is not valid JSON: {text[:60]!r}") from None
    if not isinstance(v, dict):
        raise UsageError("--config must be a JSON object")
    return v


def config_for(text: Optional[str], candidate) -> Optional[dict]:
    """config_json, checked against the keys the candidate declares (kopt.candidate.config_keys) before any work, on
    every device: an unknown key, or a value that is not a non-negative integer, true/false or null (the plan's
    default), is a usage error. A candidate that declares no keys gets its config as given."""
    from kopt.candidate import config_keys

    cfg = config_json(text)
    if not cfg:
        return cfg
    known = config_keys(candidate)
    if known is None:
        return cfg
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise UsageError(f"--config: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
                         f"(the candidate's keys: {', '.join(sorted(known))})")
    for k, v in cfg.items():
        if not (v is None or isinstance(v, bool) or (isinstance(v, int) and v >= 0)):
            raise UsageError(f"--config: {k}={json.dumps(v)} is out of range: a value is a non-negative integer, "
                             "true/false, or null (the plan's default)")
    return cfg


def one_case(text: Optional[str], flag: str = "--case", heldout: int = 0,
             heldout_seed: Optional[int] = None) -> Optional[int]:
    """The one case id of `text` (None stays None); a list, or an id that is neither in bench/cases.yaml nor in the
    held-out draw of `heldout_seed` (`heldout` draws), is a usage error."""
    from kopt import workloads
    from kopt.cases import load_cases, parse_ids

    ids = parse_ids(text)
    if ids is None:
        return None
    if len(ids) != 1:
        raise UsageError(f"{flag} takes one case id here (got {text!r})")
    workloads.one_case(load_cases(), ids[0], heldout, heldout_seed)  # unknown -> usage error listing the valid ones
    return ids[0]


def output_mode(machine: bool, as_json: bool) -> None:
    """--machine and --json are two ways to write stdout: one at a time."""
    if machine and as_json:
        raise UsageError("--machine and --json are exclusive")


def candidate_arg(option: Optional[Path], positional: Optional[Path] = None) -> Optional[Path]:
    """The candidate of --candidate, or of the older positional PATH; both at once is a usage error."""
    if option is not None and positional is not None:
        raise UsageError("give the candidate once: --candidate PATH")
    return option if option is not None else positional
