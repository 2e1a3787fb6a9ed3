"""One candidate session inside an evaluation child: load (and the tamper check), compile, checked calls,
timed calls. The bench child (kopt.eval.worker) and the tuning child (kopt.tune.worker) both run candidates
through it, so a candidate meets the same guards whichever command runs it.

The fp32 reference and the baselines' outputs never live here: checked calls save the candidate's outputs
for the parent (kopt.eval.checks) to compare after this process has exited.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Optional

from kopt.eval.jobs import CUDA_FAULTS, SavedOutput
from kopt.integrity import guards
from kopt.records import Status


class Reject(Exception):
    """Stop the evaluation with a status; `error` is the candidate's exception behind it, if any."""

    def __init__(self, status: Status, message: str, error: Optional[BaseException] = None):
        super().__init__(message)
        self.status = status
        self.error = error


def error_text(e: BaseException) -> str:
    """An exception as a result message quotes it: its type and the start of its text."""
    return f"{type(e).__name__}: {str(e)[:300]}"


def classify(e: BaseException) -> Status:
    """The status of an exception a candidate (or the device under it) raised."""
    import torch

    text = f"{type(e).__name__}: {e}"
    # CPU allocation failures say "can't allocate memory" (DefaultCPUAllocator) or are MemoryError.
    if isinstance(e, (torch.OutOfMemoryError, MemoryError)) or any(
            s in text.lower() for s in ("out of memory", "can't allocate memory")):
        return Status.oom
    if any(s in text for s in CUDA_FAULTS):
        return Status.crash
    if isinstance(e, ValueError):
        return Status.unsupported
    return Status.runtime_error


def check_tamper(before: dict, what: str) -> None:
    """Reject as `tampered` when a watched entry point is no longer what it was in `before` (kopt.integrity.guards)."""
    changed = guards.changed(before)
    if changed:
        raise Reject(Status.tampered, f"{what} patched {', '.join(changed)}")


def load(path: Path) -> ModuleType:
    """Import the candidate; a failure is compile_error (the caller then checks the import for tampering)."""
    from kopt import candidate

    try:
        return candidate.load(Path(path))
    except Exception as e:
        raise Reject(Status.compile_error, str(e)) from None


class Session:
    """Calls of one loaded candidate with one config on one device; checked outputs are saved under `out`.

    `held` keeps earlier outputs alive so that a candidate returning a buffer again is caught; `threads` are
    the harness's own threads (taken before any candidate code ran), so the candidate's are told apart."""

    def __init__(self, mod: ModuleType, device: str, out: Path, config: Optional[dict] = None,
                 threads: Optional[set] = None, outputs: Optional[list[SavedOutput]] = None):
        self.mod, self.device, self.out, self.config = mod, device, Path(out), config
        self.threads = threads if threads is not None else guards.thread_idents()
        self.held: list = []
        self.outputs: list[SavedOutput] = outputs if outputs is not None else []

    def call(self, w, poison: bool = True):
        """One candidate call (allocator poisoned first, except when timed); exceptions become a Reject."""
        kw = w.kwargs(self.config)
        try:
            if not poison:  # the timed calls: nothing between the harness and run
                return self.mod.run(*w.args(), **kw)
            guards.poison_allocator(w.q, w.q.numel())
            with guards.poisoned_empty():
                return self.mod.run(*w.args(), **kw)
        except Exception as e:
            raise Reject(classify(e), f"run raised {error_text(e)}", e) from None

    def timed(self) -> Callable[[object], object]:
        """The call the timers make (w -> output): nothing but the candidate's run."""
        return functools.partial(self.call, poison=False)

    def compile(self, w, poison: bool = True):
        """`prepare` (when declared) and the first call, synchronized; that output is held (a later call
        returning the same buffer is stale). Compilation happens here, never inside a timed call."""
        import torch

        prep = getattr(self.mod, "prepare", None)
        if callable(prep):
            try:
                prep(*w.args(), **w.kwargs(self.config))
            except Exception as e:
                raise Reject(Status.unsupported if isinstance(e, ValueError) else classify(e),
                             f"prepare raised {error_text(e)}", e) from None
        first = self.call(w, poison)
        if isinstance(first, torch.Tensor):
            self.held.append(first)
        guards.sync(self.device)
        return first

    def checked_call(self, w, kind: str) -> None:
        """Call, then check mutation, aliasing, buffer reuse and unfinished side work; save the output."""
        import torch

        guard = guards.InputGuard(w.tensors)
        out = self.call(w)
        if isinstance(out, torch.Tensor):
            early = out.detach().clone()  # ordered on the current stream only
        guards.settle_threads(self.threads)  # CPU has no device sync: wait for threads the candidate left
        guards.sync(self.device)
        if not isinstance(out, torch.Tensor):
            raise Reject(Status.incorrect_shape, f"run returned {type(out).__name__}, not a tensor")
        if guard.mutated():
            raise Reject(Status.mutated_input, "an input tensor was modified in place")
        if guards.aliases(out, w.tensors):
            raise Reject(Status.stale_output, "output shares memory with an input")
        if any(guards.aliases(out, [h]) for h in self.held):
            raise Reject(Status.stale_output, "output reuses the buffer of an earlier call")
        if out.shape == early.shape and not torch.equal(early.nan_to_num(0.5), out.detach().nan_to_num(0.5)):
            raise Reject(Status.side_stream,
                         "output still changing after run returned (work on another stream or thread)")
        self.held.append(out)
        f = self.out / f"{kind}-{w.seed}.pt"
        # Save what `run` had produced when it returned (stream-ordered on CUDA): work finishing later,
        # on a native thread or a stream nothing here can see, leaves this copy incomplete.
        torch.save(early.cpu(), f)
        self.outputs.append(SavedOutput(file=f.name, seed=w.seed, kind=kind))

    def plan_info(self, w) -> Optional[dict]:
        """The candidate's own account of the plan it ran (optional hook); informational, so failures are NA."""
        hook = getattr(self.mod, "plan_info", None)
        if not callable(hook):
            return None
        try:
            info = hook(*w.args(), **w.kwargs(self.config))
        except Exception as e:  # a report, not a result: never fails the evaluation
            return {"error": f"{type(e).__name__}: {str(e)[:120]}"}
        if not isinstance(info, dict):
            return None
        return {str(k): v for k, v in info.items() if isinstance(v, (int, float, str, bool, type(None)))}


def versions() -> dict[str, str]:
    """Library versions of this process (a copy: they cannot change while it runs)."""
    return dict(_versions_once())


@functools.lru_cache(maxsize=1)
def _versions_once() -> dict[str, str]:
    import platform

    import torch

    import kopt
    from kopt.baselines import flash_attn_version
    from kopt.baselines.base import dist_version

    v = {"python": platform.python_version(), "torch": torch.__version__, "kopt": kopt.__version__}
    v["tilelang"] = dist_version("tilelang") or "NA"
    v["flash_attn"] = flash_attn_version() or "NA"
    if torch.cuda.is_available():
        v["cuda"] = str(torch.version.cuda)
    return v
