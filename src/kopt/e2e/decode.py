"""The decode loop: one step (write this token's K/V, attend, greedy next token) run eagerly or as a captured CUDA
graph, N steps free-running or fed given tokens, each step timed (CUDA events around a replay; the host clock on a
CPU), logits and tokens kept per step."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

from kopt.e2e import kvcache, llama


@dataclass
class Decoded:
    """N steps of one run: tokens [N, B], logits [N, B, V] fp32, per-step times (ms)."""

    tokens: object
    logits: object
    times_ms: list[float]


class Stepper:
    """One run's decode step over its store, with a decode function, eager or captured in a CUDA graph."""

    def __init__(self, lm, store: kvcache.Store, decode: Callable, graph: bool, who: str = "candidate"):
        import torch

        self.lm, self.store, self.decode, self.who = lm, store, decode, who
        b = store.pos.shape[0]
        dev = store.pos.device
        self.ids = torch.zeros((b, 1), dtype=torch.long, device=dev)
        self.logits = torch.zeros((b, lm.config.vocab_size), dtype=torch.float32, device=dev)
        self.graph = None
        self.captured_calls = 0
        self.cuda = dev.type == "cuda"
        if graph and self.cuda:
            try:
                self._capture()
            except kvcache.CandidateFailure as e:
                raise kvcache.CandidateFailure(f"CUDA-graph capture of the step (--no-graph runs it eagerly): {e}",
                                               e.who) from None

    def _activate(self, step: int) -> None:
        a = kvcache.ACTIVE
        a.store, a.decode, a.prefill, a.step, a.who = self.store, self.decode, False, step, self.who

    def _step(self) -> None:
        s = self.store
        s.seqlens.copy_(s.pos + 1)
        lg = llama.forward(self.lm, self.ids, s.pos.view(-1, 1))
        self.logits.copy_(lg)
        self.ids.copy_(lg.argmax(-1, keepdim=True))
        s.pos.add_(1)

    def _capture(self) -> None:
        """Warm up on a side stream (compiles; each warm-up step's position is restored), then capture one step."""
        import torch

        s = self.store
        pos, ids = s.pos.clone(), self.ids.clone()
        self._activate(0)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._step()
                s.pos.copy_(pos)
                self.ids.copy_(ids)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        kvcache.ACTIVE.calls = 0
        with torch.cuda.graph(self.graph):
            self._step()
        self.captured_calls = kvcache.ACTIVE.calls
        s.pos.copy_(pos)
        self.ids.copy_(ids)
        torch.cuda.synchronize()

    def step(self, step: int) -> None:
        """One decode step (a replay when captured)."""
        if self.graph is not None:
            self.graph.replay()
        else:
            self._activate(step)
            self._step()

    def run(self, first, n: int, forced=None) -> Decoded:
        """n steps from the tokens `first` [B]; step t > 0 is fed forced[t - 1] when given, else its own greedy
        token. Each step timed alone (a CUDA event pair around the replay, or the host clock after a sync)."""
        import torch

        b = first.shape[0]
        toks = torch.empty((n, b), dtype=torch.long, device=first.device)
        logits = torch.empty((n, b, self.logits.shape[1]), dtype=torch.float32, device=first.device)
        self.ids.copy_(first.view(b, 1))
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)] \
            if self.cuda else []
        host = []
        for t in range(n):
            if forced is not None and t:
                self.ids.copy_(forced[t - 1].view(b, 1))
            if self.cuda:
                ev[t][0].record()
                self.step(t)
                ev[t][1].record()
            else:
                t0 = time.perf_counter()
                self.step(t)
                host.append((time.perf_counter() - t0) * 1e3)
            logits[t].copy_(self.logits)
            toks[t].copy_(self.ids.view(b))
        if self.cuda:
            torch.cuda.synchronize()
            host = [a.elapsed_time(z) for a, z in ev]
        return Decoded(toks, logits, host)

    @property
    def method(self) -> str:
        """How its steps are timed: graph (events around a replay), events (around eager launches) or host."""
        return "graph" if self.graph is not None else "events" if self.cuda else "host"

    def close(self) -> None:
        """Drop the graph and its memory pool."""
        self.graph = None


def prefill(lm, store: kvcache.Store, prompt) -> object:
    """Run the prompt [B, P] through the decoder with the library's own attention, filling the store's cache;
    returns the first greedy tokens [B] (from the last prompt position)."""
    import torch

    b, p = prompt.shape
    a = kvcache.ACTIVE
    a.store, a.prefill = store, True
    try:
        positions = torch.arange(p, device=prompt.device).view(1, p).expand(b, p)
        logits = llama.forward(lm, prompt, positions)
    finally:
        a.prefill = False
    store.pos.fill_(p)
    return logits.argmax(-1)


def timing(times_ms: list[float], warmup: int, method: str) -> Optional[object]:
    """TimingStats of per-step times after the first `warmup` steps (all of them when fewer remain than 3)."""
    import numpy as np

    from kopt.records import TimingStats
    from kopt.timing import stats

    x = np.asarray(times_ms[warmup:] if len(times_ms) - warmup >= 3 else times_ms, dtype=float)
    if not x.size or float(np.median(x)) <= 0:
        return None
    q1, med, q3 = (float(v) for v in np.percentile(x, [25, 50, 75]))
    ri = stats.rel_iqr(x)
    return TimingStats(method=method, median_ms=med, q1_ms=max(q1, 1e-9),
                       q3_ms=max(q3, 1e-9), min_ms=max(float(x.min()), 1e-9), n=int(x.size), rel_iqr=ri,
                       ci_rel=stats.ci_rel(x) if x.size >= 3 else None, noisy=stats.noisy(ri), cold=False,
                       total_s=float(np.sum(times_ms)) / 1e3)
