"""The e2e verdict: logit gaps per step under kopt's tolerance rule, greedy tokens against the baseline's (a parting
excused only at a near tie the rule allows), and the profiler's word that the candidate's kernels ran in the timed
step."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

from kopt.e2e.models import StepGap
from kopt.records import Status


def first_parting(base_tokens, cand_tokens) -> Optional[int]:
    """The first step where any sequence's greedy token differs from the baseline's (None: all the same)."""
    diff = (base_tokens != cand_tokens).any(dim=1).nonzero()
    return int(diff[0]) if diff.numel() else None


def step_gaps(base_logits, cand_logits, fp32_logits, parted: Optional[int], dtype) -> list[StepGap]:
    """Per step: the largest logit differences of the candidate (fed the baseline's tokens) to the baseline and to
    the fp32-attention run, the baseline's own, and the allowance (kopt.eval.checks.tolerance on the logits)."""
    from kopt.eval.checks import tolerance

    out = []
    for t in range(base_logits.shape[0]):
        c, b, f = cand_logits[t], base_logits[t], fp32_logits[t]
        base_err = float((b - f).abs().max())
        out.append(StepGap(step=t, same=parted is None or t < parted, vs_base=float((c - b).abs().max()),
                           vs_fp32=float((c - f).abs().max()), base_vs_fp32=base_err,
                           allowed=tolerance(f, base_err, dtype)))
    return out


def tie_margin(base_logits_t, base_tok, cand_tok) -> float:
    """How far, in the baseline's own logits of one step, the candidate's token was from the baseline's (largest over
    the sequences that parted): within the allowance, the two runs' choice is a near tie either could make."""
    import torch

    rows = (base_tok != cand_tok).nonzero().view(-1)
    lb = base_logits_t[rows]
    m = lb.gather(1, base_tok[rows].view(-1, 1)) - lb.gather(1, cand_tok[rows].view(-1, 1))
    return float(torch.as_tensor(m).max())


@dataclass
class Judged:
    """The pass / fail of a run and the one line saying why."""

    passed: bool
    status: Status
    message: str


def judge(gaps: list[StepGap], finite_bad: Optional[int], parted: Optional[int], margin: Optional[float],
          calls_ok: Optional[str], kernels_seen: Optional[bool], n: int) -> Judged:
    """The rule: finite logits; every step's gap to the fp32-attention run within its allowance; greedy tokens all
    the baseline's, or parted first at a near tie (margin within that step's allowance); the model called `run` once
    per layer per step; the profiler, where it sees kernels, saw the candidate's."""
    if finite_bad is not None:
        return Judged(False, Status.nan_inf, f"decode step {finite_bad}: the candidate's logits have NaN/Inf")
    bad = next((g for g in gaps if g.vs_fp32 > g.allowed), None)
    same = n if parted is None else parted
    if bad is not None:
        return Judged(False, Status.incorrect_numerical,
                      f"decode step {bad.step}: logit gap to the fp32-attention run {bad.vs_fp32:.4g} > allowed "
                      f"{bad.allowed:.4g} (the baseline's own gap {bad.base_vs_fp32:.4g}; to the baseline "
                      f"{bad.vs_base:.4g}); tokens the same for {same}/{n} steps")
    note = ""
    if parted is not None:
        allowed = gaps[parted].allowed
        if margin is None or margin > allowed:
            return Judged(False, Status.incorrect_numerical,
                          f"decode step {parted}: greedy token differs from the baseline's (its logit is "
                          f"{margin:.4g} below the baseline's choice, allowed {allowed:.4g}); tokens the same for "
                          f"{same}/{n} steps")
        note = (f"tokens part at decode step {parted} at a near tie (margin {margin:.4g} <= allowed {allowed:.4g}); "
                "every step's logits within the rule")
    if calls_ok:
        return Judged(False, Status.runtime_error, calls_ok)
    if kernels_seen is False:
        return Judged(False, Status.runtime_error, "the profiler did not see the candidate's kernels (once per layer) "
                                                   "in the timed step, or saw the baseline's: a fallback ran")
    return Judged(True, Status.ok, note)


def kernel_names(fn: Callable[[], object], repeat: int = 1) -> Counter:
    """Device kernels (by name, with counts) of `repeat` calls of fn under the profiler, after one call outside it
    (a first call may set up: allocate, zero counters); memcpy / memset left out."""
    import torch

    from kopt.timing.cupti import kineto_trace, profiler

    fn()
    torch.cuda.synchronize()
    with profiler() as prof:
        for _ in range(repeat):
            fn()
        torch.cuda.synchronize()
    names = Counter(r.name for r in kineto_trace(prof.events()).records)
    return Counter({k: v for k, v in names.items() if not k.startswith(("Memcpy", "Memset"))})


def kernels_seen(timed: Callable, null: Callable, cand_call: Callable, base_call: Callable, layers: int,
                 replays: int = 2) -> tuple[Optional[bool], dict[str, list[str]]]:
    """Whether every kernel of a standalone candidate call ran at least once per layer in each replay of the timed
    step and no kernel of the baseline's did (kernels of the step without attention set aside); None when the
    profiler saw no kernel in the replays."""
    rest = set(kernel_names(null))
    own = set(kernel_names(cand_call)) - rest
    theirs = set(kernel_names(base_call)) - rest - own
    seen = kernel_names(timed, replays)
    if not seen:
        return None, {}
    ran = sorted(k for k in seen if k not in rest)
    ok = bool(own) and all(seen[k] >= layers * replays for k in own) and not theirs & set(seen)
    return ok, {"candidate": ran, "candidate_standalone": sorted(own), "baseline_standalone": sorted(theirs)}
