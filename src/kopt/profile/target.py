"""The profiling target: `python -m kopt.profile.target --candidate PATH --case N [...]`.

Builds the case's seeded inputs, loads the candidate, calls it `--warmup` times (the first call
compiles), then either
- runs exactly one call inside an NVTX push/pop range named `kopt_call`, so Nsight Compute can
  filter on it (`--nvtx --nvtx-include "kopt_call/"`), or
- with `--export-trace FILE`, runs `--calls` calls under torch.profiler (kineto), each inside
  record_function("kopt_call"), and writes the chrome trace (small: a few calls, no stacks).

One line `KOPT_TARGET {json}` on stdout describes the run; errors are one stderr line, exit 1
(exit 2 for bad arguments). Profilers wrap this process; it never profiles itself otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

NVTX_RANGE = "kopt_call"
INFO_PREFIX = "KOPT_TARGET "


def build_parser() -> argparse.ArgumentParser:
    """Arguments of the target runner."""
    p = argparse.ArgumentParser(prog="python -m kopt.profile.target", description=__doc__.splitlines()[0])
    p.add_argument("--candidate", required=True, help="candidate .py file")
    p.add_argument("--case", type=int, required=True, help="case id of bench/cases.yaml, or of a held-out draw")
    p.add_argument("--heldout", type=int, default=0, help="the held-out draw's size (kopt verify --heldout)")
    p.add_argument("--heldout-seed", type=int, default=None, help="the held-out draw's seed (kopt verify "
                                                                   "--heldout-seed)")
    p.add_argument("--cases-file", default=None, help="case file (default: the workspace's)")
    p.add_argument("--dtype", default=None, help="fp16 | bf16")
    p.add_argument("--head-dim", type=int, default=None, help="64 | 128")
    p.add_argument("--page-size", type=int, default=None, help="16 | 32 | 64 | 256; 0 = contiguous")
    p.add_argument("--seqlens", default=None, help="full | ragged")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda", help="cuda | cpu")
    p.add_argument("--warmup", type=int, default=5, help="calls before the profiled one(s); the first compiles")
    p.add_argument("--calls", type=int, default=3, help="calls recorded with --export-trace")
    p.add_argument("--export-trace", default=None, help="write a kineto chrome trace of --calls calls here")
    p.add_argument("--config", default=None, help="JSON passed as run(config=...) when the candidate takes one")
    return p


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def _call(run, w, config) -> None:
    run(*w.args(), **w.kwargs(config))


def _scrub_trace(path: Path) -> int:
    """Drop host-identifying header fields torch writes (host name, absolute trace path); returns bytes."""
    data = json.loads(path.read_text())
    data.pop("host_name", None)
    if "traceName" in data:
        data["traceName"] = path.name
    text = json.dumps(data, separators=(",", ":"))
    path.write_text(text)
    return len(text)


def profile_calls(run, w, config, device: str, calls: int, out: Path) -> int:
    """`calls` calls under torch.profiler, each in record_function('kopt_call'); chrome trace to `out`."""
    from torch.profiler import ProfilerActivity, profile, record_function

    acts = [ProfilerActivity.CPU]
    if device.startswith("cuda"):
        acts.append(ProfilerActivity.CUDA)
    with profile(activities=acts, record_shapes=False, with_stack=False) as prof:
        for _ in range(max(1, calls)):
            with record_function(NVTX_RANGE):
                _call(run, w, config)
                _sync(device)
    out.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(out))
    return _scrub_trace(out)


def nvtx_call(run, w, config, device: str) -> bool:
    """Exactly one call inside the NVTX range `kopt_call`; False when NVTX is unavailable (CPU)."""
    import torch

    marked = device.startswith("cuda")
    _sync(device)
    if marked:
        try:
            torch.cuda.nvtx.range_push(NVTX_RANGE)
        except (AttributeError, RuntimeError):   # a torch build without NVTX (e.g. a vendor port)
            marked = False
    try:
        _call(run, w, config)
        _sync(device)
    finally:
        if marked:
            torch.cuda.nvtx.range_pop()
    return marked


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        info = _run(args)
    except Exception as e:  # the candidate's failure is reported, never a traceback wall
        from kopt.errors import KoptError

        print(f"kopt-target: error: {type(e).__name__}: {e}", file=sys.stderr)
        return getattr(e, "exit_code", 1) if isinstance(e, KoptError) else 1
    print(INFO_PREFIX + json.dumps(info), flush=True)
    return 0


def _run(args) -> dict:
    import torch

    from kopt import workloads
    from kopt.candidate import backend_of, candidate_id, load, resolve
    from kopt.cases import load_cases
    from kopt.workload import make_workload

    device = args.device
    named = load_cases(Path(args.cases_file) if args.cases_file else None)
    case = workloads.one_case(named, args.case, args.heldout, args.heldout_seed, cpu=device == "cpu")
    case = case.with_variant(dtype=args.dtype, head_dim=args.head_dim, page_size=args.page_size, seqlens=args.seqlens)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError("--device cuda but no CUDA device is visible")
    path = resolve(args.candidate)
    mod = load(path)
    config = json.loads(args.config) if args.config else None
    w = make_workload(case, seed=args.seed, device=device)
    t0 = time.perf_counter()
    _call(mod.run, w, config)
    _sync(device)
    first_s = time.perf_counter() - t0
    for _ in range(max(0, args.warmup - 1)):
        _call(mod.run, w, config)
    _sync(device)
    info = {"case": case.id, "variant": case.variant.label(), "shape": case.shape_dict(), "device": device,
            "device_name": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
            "backend": backend_of(mod), "candidate_id": candidate_id(path), "first_call_s": round(first_s, 4),
            "warmup": args.warmup, "torch": torch.__version__}
    if args.export_trace:
        out = Path(args.export_trace)
        info.update(mode="trace", calls=max(1, args.calls), trace=out.name,
                    trace_bytes=profile_calls(mod.run, w, config, device, args.calls, out))
    else:
        info.update(mode="nvtx", calls=1, nvtx=nvtx_call(mod.run, w, config, device), nvtx_range=NVTX_RANGE)
    return info


if __name__ == "__main__":
    sys.exit(main())
