"""`kopt lab flashinfer`: a GPU self-check of the `flashinfer` peer (the package, or kopt's C build of FlashInfer's
decode that `kopt lab flashinfer-build` makes: build()).

On a few shapes (GQA 4 and 8, head dims 64 and 128, fp16 and bf16, contiguous and pages of 16, split and unsplit KV)
its output against the fp32 reference, judged as kopt judges a peer (tolerance from torch SDPA's own error), then the
same call captured in a CUDA graph and replayed (kopt times peers that way). One line per shape.
"""

from __future__ import annotations

from collections.abc import Callable

from kopt.errors import UsageError

#: (case, dtype, head dim, page size or None for contiguous, seqlens)
SHAPES = [(10, "fp16", 128, None, "full"),     # B 1, 8192 keys, GQA 8: FlashInfer splits the KV
          (10, "bf16", 64, 16, "ragged"),
          (6, "fp16", 64, None, "ragged"),      # 362 rows: a contiguous cache in pages of 2
          (7, "bf16", 128, 16, "full"),         # B 64, GQA 4
          (12, "fp16", 128, None, "full"),      # B 8, 32768 keys, GQA 4
          (14, "bf16", 128, None, "full"),      # 61519 rows: pages of 1
          (17, "bf16", 128, 16, "ragged"),      # the case's own lengths, 1k to 128k
          (3, "bf16", 64, 16, "ragged")]        # 17 keys, GQA 8


def _case(case_id: int, dtype: str, head_dim: int, page, seqlens: str):
    from kopt.cases import load_cases, select

    return select(load_cases(), [case_id])[0].with_variant(dtype=dtype, head_dim=head_dim, page_size=page,
                                                             seqlens=seqlens)


def check(case_id: int, dtype: str, head_dim: int, page, seqlens: str) -> tuple[bool, str]:
    """(passed, the line to print) for one shape."""
    import torch

    from kopt import baselines
    from kopt.eval import check_output
    from kopt.reference import reference
    from kopt.workload import make_workload

    c = _case(case_id, dtype, head_dim, page, seqlens)
    shape = (f"case {case_id:>2} {dtype} d{head_dim} {'page' + str(page) if page else 'contig':<7} {seqlens:<6} "
             f"B{c.batch} S{c.seqlen_k} Hq{c.q_heads} Hkv{c.kv_heads}")
    peer = baselines.pick(c, "cuda", "flashinfer")
    if peer.na:
        return False, f"{shape}  NA: {peer.na}"
    w = make_workload(c, 11, "cuda")
    call = peer.bind(w)  # plan here
    out = call()
    torch.cuda.synchronize()
    ref = reference(w)
    res = check_output(out, ref, baselines.torch_attention(w), w.q)
    err = (out.float() - ref.float()).abs().max().item()
    ok = res.status.value == "ok"
    graph = "-"
    if ok:  # kopt times a peer from CUDA-graph replays: capture the same call, replay, compare
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            call()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            got = call()
        got.zero_()
        g.replay()
        torch.cuda.synchronize()
        graph = "ok" if torch.equal(got, out) else f"differs by {(got.float() - out.float()).abs().max().item():.3g}"
        ok = graph == "ok"
    tol = f"(sdpa {res.base_err:.2e}, tol {res.tol:.2e})" if res.tol is not None else res.detail
    return ok, f"{shape}  {peer.name}  max|err| {err:.3e} {tol}  {res.status.value}  graph {graph}"


def check_all(emit: Callable[[str], None] = print) -> int:
    """Every shape of SHAPES, one PASS/FAIL line each to `emit`, then a count; how many failed. A peer that is not
    available here at all is a usage error naming why (build it, or point KOPT_FLASHINFER_LIB at the library)."""
    import torch

    from kopt import baselines

    peer = baselines.pick(_case(*SHAPES[0]), "cuda", "flashinfer")
    if peer.na:
        raise UsageError(f"the flashinfer peer is not available: {peer.na}")
    emit(f"device {torch.cuda.get_device_name()} sm_{''.join(map(str, torch.cuda.get_device_capability()))}, "
         f"torch {torch.__version__}, {peer.name}{': ' + peer.note if peer.note else ''}")
    failed = 0
    for shape in SHAPES:
        try:
            ok, line = check(*shape)
        except Exception as e:  # one shape's failure is reported, the others still run
            ok, line = False, f"case {shape[0]} {shape[1:]}: {type(e).__name__}: {str(e)[:300]}"
        failed += not ok
        emit(("PASS " if ok else "FAIL ") + line)
    emit(f"{len(SHAPES) - failed}/{len(SHAPES)} passed")
    return failed


def build(wheel=None, src=None, out=None, build_dir=None, jobs: int = 0, src_tarball: bool = True) -> int:
    """Build kopt's C library of FlashInfer's decode (kopt.baselines.flashinfer_capi.BUILD_SCRIPT, a standalone
    script: nvcc, a C++17 host compiler and jinja2; no GPU) in a child process; returns its exit code. Inputs are
    checked first (UsageError)."""
    import subprocess
    import sys

    from kopt.baselines.flashinfer_capi import BUILD_SCRIPT

    if wheel is not None and src is not None:
        raise UsageError("give --wheel or --src, not both")
    for flag, path in (("--wheel", wheel), ("--src", src)):
        if path is not None and not path.is_file():
            raise UsageError(f"{flag} {path}: no such file")
    if jobs < 0:
        raise UsageError(f"--jobs must be at least 1, not {jobs}")
    args = [sys.executable, str(BUILD_SCRIPT)]
    for flag, val in (("--wheel", wheel), ("--src", src), ("--out", out), ("--build-dir", build_dir)):
        if val is not None:
            args += [flag, str(val)]
    if jobs:
        args += ["--jobs", str(jobs)]
    if not src_tarball:
        args.append("--no-src-tarball")
    return subprocess.run(args).returncode
