"""The Verdict: every perf case timed cold, a correctness matrix with fresh seeds, hidden variants."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional

from kopt.bench import BenchOptions, evaluate
from kopt.cases import Case, CaseFile
from kopt.results import CaseResult
from kopt.stats import geomean


@dataclass
class Verdict:
    """All rows of one verdict and the aggregate."""

    perf: list[CaseResult]
    matrix: list[CaseResult]
    hidden: list[CaseResult]

    @property
    def rows(self) -> list[CaseResult]:
        """Every row, perf first."""
        return self.perf + self.matrix + self.hidden

    @property
    def geomean(self) -> Optional[float]:
        """Geometric-mean SPEEDUP over the perf cases (NA if any is missing)."""
        sp = [r.speedup for r in self.perf if r.correct and r.speedup]
        if not sp or len(sp) != len(self.perf):
            return None
        return geomean(sp)

    @property
    def min_speedup(self) -> Optional[float]:
        """The slowest perf case's SPEEDUP."""
        sp = [r.speedup for r in self.perf if r.speedup]
        return min(sp) if sp else None

    @property
    def passed(self) -> bool:
        """Every row compiled and correct."""
        return bool(self.rows) and all(r.compiled and r.correct for r in self.rows)

    def line(self) -> str:
        """The aggregate machine line."""
        n_ok = sum(r.correct for r in self.rows)
        g, m = self.geomean, self.min_speedup
        return (f"VERDICT:{'pass' if self.passed else 'fail'} GEOMEAN_SPEEDUP:{'NA' if g is None else f'{g:.4f}x'} "
                f"MIN_SPEEDUP:{'NA' if m is None else f'{m:.4f}x'} CORRECT:{n_ok}/{len(self.rows)} "
                f"PERF_CASES:{len(self.perf)} MATRIX:{len(self.matrix)} HIDDEN:{len(self.hidden)}")


def hidden_cases(perf: list[Case], n: int, rng: random.Random) -> list[Case]:
    """Shapes the candidate has not seen: another batch, a perturbed seqlen, ragged lengths, either dtype."""
    out = []
    for c in rng.sample(perf, min(n, len(perf))):
        s = max(1, c.seqlen_k + rng.randint(-max(1, c.seqlen_k // 8), max(1, c.seqlen_k // 8)))
        h = c.model_copy(update={"batch": c.batch + rng.randint(1, 3), "seqlen_k": s})
        out.append(h.with_variant(seqlens="ragged", dtype=rng.choice(["fp16", "bf16"])))
    return out


def plan(cf: CaseFile, opts: BenchOptions, perf_ids: Optional[list[int]] = None) -> list[list[tuple[Case, BenchOptions]]]:
    """The Verdict's three groups (perf, matrix, hidden) as (case, options) pairs, all under one run_id."""
    import uuid

    by_id = {c.id: c for c in cf.cases}
    perf = [by_id[i] for i in perf_ids] if perf_ids else [c for c in cf.cases if c.kind == "perf"]
    base = replace(opts, mode="verdict", run_id=opts.run_id or uuid.uuid4().hex[:12])
    check = replace(base, timing=False, seeds=max(cf.verify.seeds, 1))
    matrix = replace(check, tag="matrix")
    groups: list[list[tuple[Case, BenchOptions]]] = [[(c, base) for c in perf], [], []]
    for m in cf.verify.matrix:
        groups[1] += [(by_id[i].with_variant(dtype=m.dtype, head_dim=m.head_dim, page_size=m.page_size,
                                             seqlens=m.seqlens), matrix) for i in m.cases]
    rng = random.Random()  # unseeded on purpose: hidden shapes differ at every verdict
    hidden = replace(check, tag="hidden-b{batch}-s{seqlen_k}")  # one options object: one child for all
    groups[2] = [(h, hidden) for h in hidden_cases(perf, cf.verify.hidden, rng)]
    return groups


def run(path: Path, cf: CaseFile, opts: BenchOptions, perf_ids: Optional[list[int]] = None,
        on_result: Optional[Callable[[CaseResult], None]] = None) -> Verdict:
    """Run the whole Verdict; every row goes to the ledger with mode=verdict."""
    from itertools import groupby

    rows: list[list[CaseResult]] = []
    for group in plan(cf, opts, perf_ids):
        out: list[CaseResult] = []
        # Consecutive cases with the same options share one evaluation (one child process).
        for o, items in groupby(group, key=lambda it: it[1]):
            out += evaluate(path, [c for c, _ in items], o, on_result)
        rows.append(out)
    return Verdict(*rows)
