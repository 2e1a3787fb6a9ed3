"""What every baseline is: a named callable with the candidate contract's signature, its preparation outside
the timed call, or NA with the reason (the types the adapters of this package share)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

from kopt.workload import Workload

#: The named peers, in the order the panel shows them.
PEERS = ("fa2", "fa2-paged", "fa3", "flashinfer", "torch")
#: What --baseline accepts.
BASELINE_CHOICES = ("auto",) + PEERS
#: The page of the re-paged cache FA2 is also timed on (its paged kernel needs page_size % 256 == 0).
FA2_PAGE = 256


class NotAvailable(RuntimeError):
    """Raised by calling a peer that cannot run the case (its reason is the message)."""


@dataclass
class Baseline:
    """A named callable with the candidate contract's signature, and how to prepare it outside a timed call."""

    name: str           # what ran, with its version, e.g. flash_attn-2.8.3, fa3_fwd-0.0.3, torch-cpu
    fn: Callable[[Workload], object]
    note: str = ""      # why this baseline was chosen (e.g. flash-attn missing)
    prepare: Optional[Callable[[Workload], Callable[[], object]]] = None
    """Builds a no-argument call on one input set (re-paging, planning) so the timed call is the kernel only."""
    na: Optional[str] = None
    """Why this peer cannot run the case (None: it can); `fn` then raises NotAvailable."""

    def bind(self, w: Workload) -> Callable[[], object]:
        """A no-argument call on w, its preparation done now, outside any timed span."""
        return self.prepare(w) if self.prepare else functools.partial(self.fn, w)

    def timed(self, inputs: list) -> Callable[[], object]:
        """Calls over rotated input sets, inputs[1], inputs[2], ... as kopt.timing.rotating, each prepared once."""
        from kopt.timing import Rotation

        return Rotation([self.bind(w) for w in inputs])


def unavailable(name: str, why: str) -> Baseline:
    """A peer that cannot run the case: NA with the reason, never a substitute."""
    def fn(w):
        raise NotAvailable(f"NA: {why}")

    return Baseline(name, fn, note=why, na=why)


def prepared(name: str, prepare: Callable[[Workload], Callable[[], object]], note: str = "") -> Baseline:
    """A baseline whose every input set is prepared first (the untimed `fn` prepares and calls at once)."""
    return Baseline(name, lambda w: prepare(w)(), note=note, prepare=prepare)


def dist_version(*names: str) -> Optional[str]:
    """The installed version of the first of these distributions that has package metadata, else None."""
    from importlib.metadata import PackageNotFoundError, version

    for n in names:
        try:
            return version(n)
        except PackageNotFoundError:
            continue
    return None
