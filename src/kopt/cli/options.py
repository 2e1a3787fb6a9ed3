"""Options shared by commands that select cases and variants."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import typer

from kopt.errors import UsageError


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


def resolve_cases(sel: CaseSelection, dtype=None, head_dim=None, page_size=None, seqlens=None):
    """Load bench/cases.yaml, select cases, apply variant overrides (errors are one-line usage errors)."""
    from kopt.cases import load_cases, select
    from kopt.cli.common import parse_ids

    if not sel.case and not sel.all_:
        raise UsageError("choose cases with --case N (e.g. --case 10 or --case 1,4-6) or --all")
    if sel.case and sel.all_:
        raise UsageError("--case and --all are exclusive")
    cases = select(load_cases(), parse_ids(sel.case))
    return [c.with_variant(dtype=dtype, head_dim=head_dim, page_size=page_size, seqlens=seqlens) for c in cases]
