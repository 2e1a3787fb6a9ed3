"""Dynamic integrity guards used inside the evaluation child: tamper, mutation, alias and poison checks."""

from __future__ import annotations

import time
from contextlib import contextmanager

#: Entry points the harness relies on; a candidate that replaces any of them is `tampered`.
_WATCHED = (
    ("time", "perf_counter"), ("time", "perf_counter_ns"), ("time", "time"),
    ("torch", "equal"), ("torch", "isfinite"), ("torch", "allclose"), ("torch", "save"),
    ("torch.cuda", "synchronize"), ("torch.cuda", "Event"), ("torch.cuda", "graph"),
    ("torch.cuda", "CUDAGraph"), ("torch.profiler", "profile"), ("torch.Tensor", "clone"),
    ("torch.Tensor", "copy_"), ("torch.Tensor", "float"), ("torch.Tensor", "cpu"),
    ("torch.Tensor", "data_ptr"), ("torch.cuda.Event", "record"), ("torch.cuda.Event", "elapsed_time"),
    ("kopt.timing", "time_fn"), ("kopt.timing", "time_pair"), ("kopt.timing.api", "time_fn"),
    ("kopt.timing.api", "time_pair"), ("kopt.integrity.guards", "snapshot"), ("kopt.integrity.guards", "changed"),
    ("kopt.eval.session", "check_tamper"), ("kopt.eval.jobs", "write_result"), ("kopt.atomic", "write_text"),
)


def _resolve(path: str):
    import importlib

    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for p in parts[i:]:
            obj = getattr(obj, p)
        return obj
    raise ImportError(path)


def snapshot() -> dict[str, int]:
    """Identity of every watched entry point."""
    out = {}
    for mod, name in _WATCHED:
        try:
            out[f"{mod}.{name}"] = id(getattr(_resolve(mod), name))
        except (ImportError, AttributeError):
            continue
    return out


def changed(before: dict[str, int]) -> list[str]:
    """Names of watched entry points that no longer are the objects they were."""
    now = snapshot()
    return sorted(k for k, v in before.items() if now.get(k) != v)


class InputGuard:
    """Exact copies of the inputs, to detect in-place mutation by the candidate."""

    def __init__(self, tensors):
        self._orig = [(t, t.detach().clone()) for t in tensors]

    def mutated(self) -> bool:
        """True when any input differs from its copy."""
        import torch

        return any(not torch.equal(t, c) for t, c in self._orig)


def _span(t) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.data_ptr() + s.nbytes()


def aliases(out, tensors) -> bool:
    """True when `out` shares memory with any of `tensors`."""
    import torch

    if not isinstance(out, torch.Tensor) or out.device.type == "meta":
        return False
    a0, a1 = _span(out)
    for t in tensors:
        if t is None or t.device != out.device:
            continue
        b0, b1 = _span(t)
        if a0 < b1 and b0 < a1:
            return True
    return False


def poison_allocator(like, numel: int) -> None:
    """Fill soon-to-be-reused allocator blocks with NaN so unwritten output elements show up."""
    import torch

    p = torch.full((max(numel, 1) * 2,), float("nan"), dtype=like.dtype, device=like.device)
    # Exact-size blocks too: a freed output of an earlier call (same size) is what an allocator hands
    # back first, and it may hold a correct answer that would hide unwritten elements.
    exact = [torch.full((max(numel, 1),), float("nan"), dtype=dt, device=like.device)
             for dt in (like.dtype, torch.float32) for _ in range(4)]
    del p, exact


@contextmanager
def poisoned_empty():
    """While a checked call runs, torch.empty / torch.empty_like / Tensor.new_empty hand out
    NaN-filled floating-point memory, so an output element the candidate never writes is NaN
    whatever block the allocator reuses (poison_allocator alone is best effort: a CPU malloc may hand
    back a block still holding an earlier correct answer). Restored afterwards, before the tamper
    snapshot is compared."""
    import torch

    saved = (torch.empty, torch.empty_like, torch.Tensor.new_empty)

    def _nan(t):
        if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()):
            t.fill_(float("nan"))
        return t

    def empty(*a, **k):
        return _nan(saved[0](*a, **k))

    def empty_like(*a, **k):
        return _nan(saved[1](*a, **k))

    def new_empty(self, *a, **k):
        return _nan(saved[2](self, *a, **k))

    torch.empty, torch.empty_like, torch.Tensor.new_empty = empty, empty_like, new_empty
    try:
        yield
    finally:
        torch.empty, torch.empty_like, torch.Tensor.new_empty = saved


def thread_idents() -> set[int]:
    """Idents of the Python threads alive now."""
    import threading

    return {t.ident for t in threading.enumerate()}


def settle_threads(baseline: set[int], timeout_s: float = 2.0) -> None:
    """Wait (bounded) for Python threads started after `baseline`: on CPU, sync() cannot see them,
    so a thread finishing the output after `run` returned is only visible once it has run."""
    import threading

    deadline = _perf() + timeout_s
    for t in threading.enumerate():
        if t.ident in baseline or t is threading.current_thread():
            continue
        t.join(max(0.0, deadline - _perf()))


def sync(device: str) -> None:
    """Device-wide synchronization (all streams)."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def now() -> float:
    """Monotonic seconds, captured before the candidate can patch anything."""
    return _perf()


_perf = time.perf_counter
