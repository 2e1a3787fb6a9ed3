"""Compile every CUDA kernel variant of the shipped candidate in parallel, ahead of a GPU session.

TileLang keeps compiled kernels in its on-disk cache, so the benches and tests that follow load them
instead of compiling one after the other (about 10 s each on an H200 host).

    python3 scripts/prewarm_kernels.py [--jobs N] [--list]

The variants: every (dtype, layout, query heads, kv heads, head dim) that bench/cases.yaml, the GPU
test matrix and the verify matrix use, with the tile and split choices the kernel's heuristic and
its tuning configs make (see specs()). Prints one line per finished kernel and a summary.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOL = os.path.join(ROOT, "solution", "tilelang")

DTYPES = ("float16", "bfloat16")
PAGES = (0, 16, 64, 256)
CASE_HEADS = ((32, 4), (32, 8))  # (hq, hkv) of the 14 cases: GQA 8 and 4
# MHA / MQA / G16 shapes of the GPU tests (batch 3, 3001 keys: split, 64-key tiles)
OTHER_HEADS = ((32, 32), (8, 8), (32, 1), (8, 1), (32, 2))


def specs() -> list[tuple]:
    """(kind, dtype, hq, hkv, d, page, block_N, split, fused) of every kernel the runs use: the split
    heuristic picks direct kernels with 64- or 128-key tiles or split kernels with 64-key tiles;
    tuning also tries split kernels with 128-key tiles (fp16, contiguous)."""
    out = []
    for dtype in DTYPES:
        for hq, hkv in CASE_HEADS:
            for page in PAGES:
                out += [("decode", dtype, hq, hkv, 128, page, 64, False, True),
                        ("decode", dtype, hq, hkv, 128, page, 128, False, True),
                        ("decode", dtype, hq, hkv, 128, page, 64, True, True)]
            out += [("decode", dtype, hq, hkv, 64, 0, 64, False, True),
                    ("decode", dtype, hq, hkv, 64, 0, 64, True, True)]
    for hq, hkv in CASE_HEADS:
        out.append(("decode", "float16", hq, hkv, 128, 0, 128, True, True))
    for hq, hkv in OTHER_HEADS:
        for page in (0, 256):
            out.append(("decode", "float16", hq, hkv, 128, page, 64, True, True))
    out.append(("combine", "float16", 32, 4, 128, 0, 0, True, False))  # the unfused variant's combine
    return out


def _compile(spec: tuple) -> tuple:
    sys.path.insert(0, SOL)
    import torch

    import tl_decode_cuda as cu

    t0 = time.perf_counter()
    kind, dtype, hq, hkv, d, page, bn, split, fused = spec
    target = cu.cuda_target(torch.device("cuda", 0))
    scale = 1.0 / math.sqrt(d)
    if kind == "combine":
        cu.get_combine(dtype, hq, d, target)
    else:
        cu.get_decode(dtype, hq, hkv, d, page > 0, page, bn, 1, 128, split, scale, target, fused)
    return spec, time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    ap.add_argument("--list", action="store_true", help="print the variants and exit")
    a = ap.parse_args(argv)
    todo = specs()
    if a.list:
        for s in todo:
            print(*s)
        print(f"{len(todo)} kernels")
        return 0
    t0 = time.perf_counter()
    failed = 0
    with ProcessPoolExecutor(max_workers=a.jobs, mp_context=get_context("spawn")) as ex:
        futs = {ex.submit(_compile, s): s for s in todo}
        for i, f in enumerate(as_completed(futs), 1):
            try:
                spec, dt = f.result()
                print(f"[{i}/{len(todo)}] {' '.join(map(str, spec))}: {dt:.1f} s", flush=True)
            except Exception as e:  # report and go on: one bad variant must not stop the rest
                failed += 1
                print(f"[{i}/{len(todo)}] {' '.join(map(str, futs[f]))}: FAILED {type(e).__name__}: "
                      f"{str(e).splitlines()[-1] if str(e) else ''}", flush=True)
    print(f"prewarm: {len(todo) - failed}/{len(todo)} kernels in {time.perf_counter() - t0:.1f} s "
          f"with {a.jobs} jobs", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
