"""Baselines and peers: the decode kernels a candidate is timed against, each labelled with its version.

`pick(case, device, "auto")` is the default baseline: flash_attn_with_kvcache where it runs (a cache in
pages FA2 cannot take re-laid in its pages of 256, outside the timed call), else a torch implementation
labelled as such. Named peers (`fa2`, `fa2-paged`, `fa3`, `flashinfer`, `torch`)
never fall back: a peer that cannot run a case is returned with `na` set to the reason, and calling
it raises NotAvailable. The Hopper peers (FA3, FlashInfer) live in kopt.baselines.hopper.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import replace
from typing import Optional

from kopt.baselines.base import (  # noqa: F401  (the package's face: the types every adapter shares)
    BASELINE_CHOICES,
    FA2_PAGE,
    PEERS,
    Baseline,
    NotAvailable,
    dist_version,
    prepared,
    unavailable,
)
from kopt.cases import Case
from kopt.workload import Workload


def flash_attn_version() -> Optional[str]:
    """flash-attn's version when it imports, else None."""
    try:
        flash_attn = importlib.import_module("flash_attn")
    except Exception:
        return None
    return getattr(flash_attn, "__version__", "unknown")


def _fa_supports(case: Case) -> Optional[str]:
    """None when flash-attn 2 handles the case, else the reason it does not."""
    v = case.variant
    if v.head_dim not in (64, 128):
        return f"head_dim {v.head_dim} not in this flash-attn build"
    if v.page_size is not None and v.page_size % 256:
        return f"flash-attn 2 paged KV needs page_size % 256 == 0 (got {v.page_size})"
    return None


def is_candidate_file(spec: str) -> bool:
    """Whether a peer spec names a candidate file (an earlier candidate timed as a peer: a .py path, REV:PATH.py, or a
    patch over the shipped candidate) rather than a named peer."""
    from kopt.candidate import PATCH_SUFFIXES

    return spec.endswith((".py", *PATCH_SUFFIXES))


#: How a row or a panel names an earlier candidate timed as a peer: this prefix and its candidate id.
CANDIDATE_PEER = "cand-"


def peer_name(spec: str) -> str:
    """A peer's name in rows and panels: the named peer itself, or `cand-<candidate id>` for a candidate file."""
    if not is_candidate_file(spec):
        return spec
    from pathlib import Path

    from kopt.candidate import candidate_id

    return f"{CANDIDATE_PEER}{candidate_id(Path(spec))}"


def named_first(items: list, name=lambda x: x.peer) -> list:
    """The named peers among items (FA2, FA3, ...), else all: an earlier candidate timed as a peer is reported beside
    them and never stands for the best peer while a named one ran."""
    named = [x for x in items if not name(x).startswith(CANDIDATE_PEER)]
    return named or items


def pick(case: Case, device: str, prefer: str = "auto") -> Baseline:
    """The baseline `prefer` names. auto: flash_attn_with_kvcache(num_splits=0) on CUDA when possible,
    else torch, labelled so (never silently); a named peer: that peer, or NA with the reason; a candidate file
    (`*.py`): that candidate's `run` (its own plan), imported beside the one timed."""
    from kopt.errors import UsageError

    if is_candidate_file(prefer):
        return _candidate_file(prefer)

    if prefer == "auto":
        if device == "cpu":
            return Baseline("torch-cpu", torch_attention, "CPU run: torch reference implementation")
        fa2 = _fa2(case, device)
        if fa2.na is not None and case.variant.page_size:
            # FA2 pages only by 256: a serving engine running FA2 lays its cache so; timing torch instead would
            # flatter a candidate in pages of 16-64 by 3-12x (H200, held-out draws of 2026-12-04)
            paged = _fa2_paged(case, device)
            fa2 = paged if paged.na is None else fa2
        return fa2 if fa2.na is None else Baseline("torch-sdpa", torch_attention, fa2.na)
    make = _ADAPTERS.get(prefer)
    if make is None:
        raise UsageError(f"unknown baseline {prefer!r}; use one of {', '.join(BASELINE_CHOICES)}")
    return make(case, device)


def tolerance_baseline(case: Case, device: str, prefer: str = "auto") -> Baseline:
    """The baseline whose error sets the correctness tolerance: the default one unless torch was asked
    for. A peer never does: one that is NA (or wrong) must not loosen or tighten the candidate's check."""
    return pick(case, device, "torch" if prefer == "torch" else "auto")


def _fa2(case: Case, device: str) -> Baseline:
    ver = flash_attn_version() if device == "cuda" else None
    why = ("needs CUDA" if device != "cuda" else "flash-attn not importable" if ver is None
           else _fa_supports(case))
    return unavailable("fa2", why) if why else Baseline(f"flash_attn-{ver}", flash_attn_kvcache)


def _fa2_paged(case: Case, device: str) -> Baseline:
    """FA2 on the same logical cache laid out in shuffled pages of 256 (built outside the timed call);
    a case already paged by 256 is run on its own pages."""
    from kopt.workload import page_cache

    base = _fa2(case.with_variant(page_size=FA2_PAGE), device)
    if base.na:
        return replace(base, name="fa2-paged")
    name = f"{base.name}-paged{FA2_PAGE}"
    if case.variant.page_size == FA2_PAGE:
        return Baseline(name, flash_attn_kvcache, note="the case's own pages")

    def prepare(w: Workload):
        k, v = w.logical_kv()
        kp, vp, table = page_cache(k, v, FA2_PAGE, w.seed, k.device)
        return functools.partial(flash_attn_kvcache, replace(w, k_cache=kp, v_cache=vp, block_table=table))

    return prepared(name, prepare, note=f"the logical cache re-laid in pages of {FA2_PAGE}")


def _torch(case: Case, device: str) -> Baseline:
    import torch

    kind = "cpu" if device == "cpu" else "sdpa"
    return Baseline(f"torch-{kind}-{torch.__version__}", torch_attention, "torch SDPA peer")


def _hopper(kind: str) -> Callable[[Case, str], Baseline]:
    def make(case: Case, device: str) -> Baseline:
        from kopt.baselines import hopper

        return getattr(hopper, kind)(case, device)

    return make


@functools.cache
def _peer_module(spec: str):
    """An earlier candidate's module, imported once per process (every case of a peers run shares it and the kernels
    it compiled), with its own sibling modules (kopt.candidate.load keeps the timed candidate's)."""
    from pathlib import Path

    from kopt import candidate

    return candidate.load(Path(spec))


def _candidate_file(spec: str) -> Baseline:
    """An earlier candidate as a peer (_peer_module): its `prepare` (when declared) done when an input set is bound,
    outside the timed calls; NA with the reason when it does not import."""
    from pathlib import Path

    name = peer_name(spec)
    try:
        mod = _peer_module(spec)
    except Exception as e:  # noqa: BLE001  (a peer that does not import is NA, never the timed candidate's failure)
        return unavailable(name, f"{Path(spec).name} does not import: {str(e)[:200]}")

    def call(w: Workload):
        return mod.run(w.q, w.k_cache, w.v_cache, w.cache_seqlens, w.block_table, w.softmax_scale)

    def prepare(w: Workload):
        prep = getattr(mod, "prepare", None)
        if callable(prep):
            prep(w.q, w.k_cache, w.v_cache, w.cache_seqlens, w.block_table, w.softmax_scale)
        return functools.partial(call, w)

    return Baseline(name, call, note=f"candidate {spec}", prepare=prepare)


_ADAPTERS: dict[str, Callable[[Case, str], Baseline]] = {
    "fa2": _fa2, "fa2-paged": _fa2_paged, "fa3": _hopper("fa3"), "flashinfer": _hopper("flashinfer"),
    "torch": _torch,
}


def flash_attn_kvcache(w: Workload):
    """FlashAttention 2's decode entry point with its own split heuristic (num_splits=0)."""
    flash_attn_with_kvcache = importlib.import_module("flash_attn").flash_attn_with_kvcache

    return flash_attn_with_kvcache(
        w.q, w.k_cache, w.v_cache, cache_seqlens=w.cache_seqlens, block_table=w.block_table,
        softmax_scale=w.softmax_scale, causal=False, num_splits=0)


def torch_attention(w: Workload):
    """SDPA in the input dtype over the (gathered) logical cache, masked to each sequence's length."""
    import torch
    import torch.nn.functional as F

    k, v = w.logical_kv()
    s = k.shape[1]
    q = w.q.transpose(1, 2)                       # [B, Hq, 1, D]
    kt, vt = k.transpose(1, 2), v.transpose(1, 2)  # [B, Hkv, S, D]
    mask = torch.arange(s, device=k.device)[None, :] < w.cache_seqlens[:, None].to(k.device)
    out = F.scaled_dot_product_attention(q, kt, vt, attn_mask=mask[:, None, None, :],
                                         scale=w.softmax_scale, enable_gqa=True)
    return out.transpose(1, 2)
