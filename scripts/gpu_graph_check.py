"""Independent check of kopt's device-only figures: CUDA graphs of [flush, call] x N under CUPTI.

For each case the shipped candidate and FA2 are each captured in one CUDA graph of N pairs (a read of a
256 MiB buffer, then the call) and the graph is replayed under torch.profiler; a call's time is the first
start to the last end of a run of consecutive records named as the call's kernels (seen in a profile of
the call alone; none of them may share a name with the flush's).
Nothing of kopt's timer is used (only its case file and input builder), so the figures are a second
measurement of the same calls. With
--ledger, each case's figures are set beside the latest `kopt bench` row of the same candidate in the
ledger (RUNTIME, REF_RUNTIME) and the table says whether they agree within 3% or 0.3 µs.

Run from the workspace root:  PYTHONPATH=src python3 scripts/gpu_graph_check.py --cases 1-18 \
    [--ledger candidates.jsonl] [--out results/graph-check-H200.md]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FLUSH_BYTES = 256 << 20


def mark():
    """A one-cycle spin kernel between the flush and the call: its name (torch's spin kernel) is used by
    neither the flush nor a decode call, so it splits the trace into calls unambiguously (the flush's own
    kernels, a memset among them, can also appear inside a call)."""
    import torch

    torch.cuda._sleep(1)


def graph_spans(fn, flush, n: int, replays: int) -> list[float]:
    """µs per call of fn from `replays` replays of one graph of [flush, fn] x n, read from CUPTI: a call is
    a run of consecutive records whose names fn launches and the flush does not (RuntimeError when fn and
    the flush share a name, or the runs are not n x replays)."""
    own = kernel_names(fn) - kernel_names(flush)
    if own != kernel_names(fn):
        raise RuntimeError(f"the call launches what the flush does: {sorted(kernel_names(fn) - own)}")
    spans, others = replayed_runs(lambda: (flush(), fn()), n, replays, own)
    if others:
        print(f"records in the graph that neither the call nor the flush launch: {sorted(others)}", file=sys.stderr)
    if len(spans) != n * replays:
        raise RuntimeError(f"{len(spans)} spans for {n * replays} calls")
    return spans


def replayed_runs(body, n: int, replays: int, own) -> tuple[list[float], set]:
    """call_runs of the records of `replays` replays of one CUDA graph of body x n under CUPTI (body warmed up on a
    side stream first, as capture wants)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            body()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            body()
    g.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            g.replay()
        torch.cuda.synchronize()
    return call_runs(device_records(prof), own)


def read_flush():
    """The cold flush, a read of FLUSH_BYTES into one word, as a function; its kernels and mark's join FLUSH_NAMES
    (records that belong to no call)."""
    import torch

    buf = torch.zeros(FLUSH_BYTES // 4, dtype=torch.float32, device="cuda")
    sink = torch.zeros(1, dtype=torch.float32, device="cuda")

    def flush():
        torch.sum(buf, dim=0, keepdim=True, out=sink)

    FLUSH_NAMES.update(kernel_names(flush) | kernel_names(mark))
    return flush


def call_runs(recs, own) -> tuple[list[float], set]:
    """Spans (µs) of the runs of consecutive records named in `own`, and the names of records in neither."""
    out, cur, others = [], [], set()
    for s0, e0, name in recs + [(0, 0, None)]:
        if name in own:
            cur.append((s0, e0))
            continue
        if name is not None and name not in FLUSH_NAMES:
            others.add(name)
        if cur:
            out.append((max(e for _, e in cur) - cur[0][0]) / 1e3)
            cur = []
    return out, others


def device_records(prof) -> list[tuple[int, int, str]]:
    """(start, end, name) of the device records of a profile, by start."""
    return sorted((e.start_ns(), e.end_ns(), record_name(e.name())) for e in prof.profiler.kineto_results.events()
                  if not str(e.device_type()).endswith("CPU") and not e.is_user_annotation())


def record_name(n: str) -> str:
    """A record's name; a memset or memcpy by its kind alone (kineto's memory kind differs between a call
    and its capture: "Memset (Device)" / "Memset (Unknown)")."""
    return n.split(" (")[0] if n.startswith(("Memset", "Memcpy")) else n


def ways(fn, flush, n: int) -> dict[str, tuple[float, str]]:
    """--diagnose: the same call timed five ways, each (median µs, its kernels with median durations and
    any record neither it nor the flush launches): one graph of [flush, mark, call] x n, one of
    [flush, call] x n (the check's way), the stream ([flush, mark, call] launched one by one behind a spin
    hold), a graph of the call alone replayed after a stream flush, and a graph of [flush, call] replayed
    once a call behind a spin hold (kopt's way, written again here)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    own = kernel_names(fn) - FLUSH_NAMES

    def graph(body):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            body()
        g.replay()
        torch.cuda.synchronize()
        return g

    hold = lambda: torch.cuda._sleep(2_000_000)  # noqa: E731  (~1 ms: the host gets far ahead)
    big = graph(lambda: [(flush(), mark(), fn()) for _ in range(n)])
    plain = graph(lambda: [(flush(), fn()) for _ in range(n)])
    one, pair = graph(fn), graph(lambda: (flush(), fn()))
    got = {}
    for name, go in (("graph [flush, mark, call]", big.replay), ("graph [flush, call]", plain.replay),
                     ("stream [flush, mark, call]", lambda: (hold(), [(flush(), mark(), fn()) for _ in range(n)])),
                     ("stream flush + graph [call]", lambda: (hold(), [(flush(), one.replay()) for _ in range(n)])),
                     ("graph [flush, call] per call", lambda: (hold(), [pair.replay() for _ in range(n)]))):
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                go()
            torch.cuda.synchronize()
        recs = device_records(prof)
        spans, others = call_runs(recs, own)
        kern: dict = {}
        for s0, e0, k in recs:
            if k in own:
                kern.setdefault(k, []).append((e0 - s0) / 1e3)
        ks = ", ".join(f"{k[:40]} {statistics.median(v):.2f}" for k, v in kern.items())
        extra = f"; also {sorted(others)}" if others else ""
        got[name] = (statistics.median(spans) if spans else float("nan"), f"{len(spans)} calls: {ks}{extra}")
    return got


_NAMES: dict = {}
FLUSH_NAMES: set = set()


def kernel_names(fn) -> set:
    """The kernel names fn launches, seen in a profile of fn alone."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if fn not in _NAMES:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
        _NAMES[fn] = {name for _, _, name in device_records(prof)}
        print(f"kernels of {getattr(fn, '__name__', fn)}: {sorted(_NAMES[fn])}", file=sys.stderr)
    return _NAMES[fn]


def latest_rows(ledger: Path, candidate_id: str, labels: dict[int, str]) -> dict[int, dict]:
    """Latest signal row per case of this candidate with timings, in the case's own variant (labels: case
    id -> variant label, the inputs the script times), from the ledger."""
    from kopt.workspace.ledger import load_dicts
    from kopt.workspace.ranking import row_cid

    rows = {}
    for r in load_dicts(ledger).rows:  # kopt's tolerant reader (torn lines skipped)
        if r.get("mode") == "signal" and row_cid(r) == candidate_id and r.get("runtime_ms") \
                and r.get("variant") == labels.get(r.get("case")):
            rows[r["case"]] = r
    return rows


def agree(a: float, b: float) -> bool:
    """Within 3% or 0.3 µs (ms inputs)."""
    return abs(a - b) <= max(0.03 * b, 0.3e-3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="1-18")
    ap.add_argument("--calls", type=int, default=20, help="pairs in one graph")
    ap.add_argument("--replays", type=int, default=15)
    ap.add_argument("--ledger", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--candidate", type=Path)
    ap.add_argument("--diagnose", action="store_true", help="time each call five ways (graphs and the stream, "
                                                            "with and without marks) and list its kernels, instead")
    args = ap.parse_args()
    from kopt import hardware as _hw

    _hw.exit_unless_cuda(os.path.basename(__file__))  # a GPU tool on a host without one: one line, exit 2

    import torch

    from kopt import baselines, candidate, cases
    from kopt.cli.common import parse_ids
    from kopt.paths import default_candidate
    from kopt.workload import make_workload

    shipped = args.candidate or default_candidate(REPO)
    mod = candidate.load(shipped)
    cid = candidate.candidate_id(shipped)
    flush = read_flush()
    ids = parse_ids(args.cases)
    sel = cases.select(cases.load_cases(), ids)
    led = latest_rows(args.ledger, cid, {c.id: c.variant.label() for c in sel}) if args.ledger else {}
    lines = ["| case | candidate graph µs | kopt RUNTIME µs | Δ | FA2 graph µs | kopt REF_RUNTIME µs | Δ | agree |",
             "|---|---|---|---|---|---|---|---|"]
    worst = []
    for c in sel:
        w = make_workload(c, seed=0, device="cuda")
        base = baselines.pick(c, "cuda")
        fns = {"cand": lambda w=w: mod.run(*w.args(), **w.kwargs()), "ref": lambda w=w, base=base: base.fn(w)}
        med = {}
        if args.diagnose:
            for k, fn in fns.items():
                fn()
                for way, (us, ks) in ways(fn, flush, args.calls).items():
                    print(f"case {c.id} {k:4} {way:28} {us:8.2f} µs  {ks}", flush=True)
            continue
        for k, fn in fns.items():
            try:
                fn()
                med[k] = statistics.median(graph_spans(fn, flush, args.calls, args.replays)) / 1e3
            except Exception as e:  # a call that cannot be captured: NA, with the reason
                print(f"case {c.id} {k}: NA ({type(e).__name__}: {str(e)[:120]})", file=sys.stderr)
                med[k] = None
        row = led.get(c.id, {})
        cells, ok = [], True
        for k, key in (("cand", "runtime_ms"), ("ref", "ref_runtime_ms")):
            g, kk = med[k], row.get(key)
            if g is None or kk is None:
                cells += [_us(g), _us(kk), "NA"]
                ok = False if g is None else ok
                continue
            cells += [_us(g), _us(kk), f"{100 * (kk - g) / g:+.1f}%"]
            ok = ok and agree(kk, g)
            worst.append((abs(kk - g) / g, c.id, k))
        lines.append(f"| {c.id} | " + " | ".join(cells) + f" | {'yes' if ok else 'no'} |")
        print(lines[-1], flush=True)
        del w
        torch.cuda.empty_cache()
    dev = torch.cuda.get_device_name()
    head = [f"# Graph-replayed CUPTI spans vs kopt's device-only figures ({dev}, candidate {cid})", "",
            f"{args.calls} [flush, call] pairs per graph, {args.replays} replays, median; kopt rows: the ledger's "
            "latest contiguous signal row of the same candidate per case.", ""]
    if worst:
        w0 = max(worst)
        head.append(f"Largest difference: case {w0[1]} ({'candidate' if w0[2] == 'cand' else 'FA2'}), "
                    f"{100 * w0[0]:.1f}%.")
        head.append("")
    text = "\n".join(head + lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


def _us(ms) -> str:
    return "NA" if ms is None else f"{ms * 1e3:.2f}"


if __name__ == "__main__":
    sys.exit(main())
