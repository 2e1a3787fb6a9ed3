"""What the lab's GPU studies share: the GPU check, the cases, the candidate, the header line and the table file."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Optional

from kopt.errors import UsageError


def require_cuda(tool: str, hint: str = "") -> None:
    """A GPU-only study on a host without a CUDA device: a usage error (one line, exit 2, `hint` after it in
    parentheses), before any work."""
    from kopt import hardware

    if why := hardware.cuda_missing(tool):
        raise UsageError(why + (f" ({hint})" if hint else ""))


def pick_cases(ids: str, page_size: Optional[int] = None, heldout: int = 0, seed: Optional[int] = None) -> list:
    """The cases of `ids` ('10,14' or '4-18') from the workspace's bench/cases.yaml, each in its own layout, or in
    pages of `page_size` (0: contiguous) when it is given; with a `seed`, ids past 1000 are that seed's held-out draw
    of `heldout` shapes, as `kopt verify --heldout-seed` numbers them. Bad or unknown ids are usage errors."""
    from kopt import workloads
    from kopt.cases import load_cases, parse_ids

    if page_size not in (None, 0, 16, 32, 64, 256):
        raise UsageError(f"--page-size must be 0 (contiguous), 16, 32, 64 or 256 (got {page_size})")
    cases = workloads.pick(load_cases(), parse_ids(ids), heldout, seed)
    return cases if page_size is None else [c.with_variant(page_size=page_size) for c in cases]


def candidate_path(path: Optional[Path] = None) -> Path:
    """The candidate file (a usage error when it is missing; REV:PATH, a commit's), by default the workspace's
    shipped one."""
    from kopt import paths
    from kopt.store import resolve_candidate

    return resolve_candidate(path if path is not None else paths.default_candidate())


def header(**facts) -> str:
    """The first line of a study: the device, the workspace's commit (NA outside a repository), then `facts`."""
    from kopt import hardware, paths
    from kopt.store import vcs

    dev = hardware.detect("cuda")
    commit = vcs.head_short(paths.workspace()) or "NA"
    return " ".join([f"device={dev.name}", f"commit={commit}"] + [f"{k}={v}" for k, v in facts.items()])


def workloads(case, device: str = "cuda", seeds: Iterable[int] = (0, 1, 2)) -> list:
    """A case's inputs for three seeds: the rotated input sets a study times over."""
    from kopt.workload import make_workload

    return [make_workload(case, s, device) for s in seeds]


def write_table(path: Optional[Path], lines: list[str]) -> None:
    """Also write a study's table (markdown) to `path`, when one is given."""
    if path is not None:
        from kopt import atomic

        atomic.write_text(Path(path), "\n".join(lines) + "\n")


def plan_oracle(mod, case, profile: Optional[dict]):
    """A callable config -> the candidate's plan of `case` on the device of `profile` (its device_plan: no compile),
    None where the candidate refuses the config; None itself where the candidate has no device_plan or there is no
    profile (configs are then laid over the plan whole)."""
    from kopt.doctor import hook_plan

    if profile is None or not hasattr(mod, "device_plan"):
        return None
    shape = case.shape_dict()
    return lambda cfg: hook_plan(mod, shape, profile, cfg)[0]


def host_profile() -> Optional[dict]:
    """The hardware.yaml profile of this host's CUDA device, None where none matches."""
    from kopt.eval import device_profile

    try:
        return device_profile()
    except UsageError:
        return None
