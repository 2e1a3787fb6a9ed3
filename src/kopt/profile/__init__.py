"""See the kernel: profiler adapters, chrome-trace summaries and the six-dimension diagnosis.

- `target`     : `python -m kopt.profile.target` builds a case's inputs, warms a candidate up and
                 runs exactly one call in an NVTX range `kopt_call` (or a few calls under torch.profiler).
- `ncu`        : Nsight Compute command lines, CSV import and parsing (NVIDIA).
- `metax`      : mcProfiler (counters) and mcTracer (timeline) adapters (MetaX MACA).
- `torchprof`  : the always-available fallback: a kineto chrome trace of a few calls.
- `trace`      : `kopt trace summarize`: per-kernel totals, launch gaps, tail effect.
- `diagnosis`  : six dimensions scored ok / watch / limiting, mapped to checklist patterns.
- `runner`     : `kopt profile`: pick a tool, run it, write summary.md / summary.json.

Nothing here imports torch at module level; the adapters run the target in a child process.
"""
