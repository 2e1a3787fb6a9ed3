"""`kopt e2e`: the candidate inside a real model's decode loop.

A Hugging Face transformers Llama decoder of a workload-library model's attention shape (random weights from a
seed; with `--fit-steps`, fitted first to continue a repeated block, kopt.e2e.fit) prefills a seeded prompt with
the library's own attention, then decodes N tokens greedily with the baseline and with the candidate as the decode
attention (kopt's attention backend, registered in transformers' attention registry, owns the KV cache in the
layout each kernel takes), plus a run with fp32 attention. Reported: tokens the same, logit gaps per step (kopt's
tolerance rule), step latency both ways (CUDA-graph replays on a GPU), the attention's share of the step, and
whether the profiler saw the candidate's kernels in the timed step.

The run happens in a child process (a crashing candidate or a hung kernel cannot take kopt down); only this module's
light imports run in the parent.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Optional

from kopt.e2e.models import E2EOptions, E2EResult, StepGap, check_context, latest_line, parse_line  # noqa: F401
from kopt.errors import UsageError
from kopt.records import Status

#: Sizes of the CPU's tiny configuration, and the defaults on a GPU (TinyLlama's depth, seed 000's context).
CPU_DEFAULTS = {"layers": 2, "batch": 2, "prompt_len": 32, "tokens": 8}
CUDA_DEFAULTS = {"layers": 22, "batch": 1, "prompt_len": 1536, "tokens": 64}
#: The small check `kopt verify --e2e` runs: the seed's model, paged in pages of 16, few steps.
SMALL_CHECK = {"model": "tinyllama-1.1b", "page_size": 16, "dtype": "bf16"}
SMALL_SIZES = {"cpu": {"layers": 2, "batch": 2, "prompt_len": 32, "tokens": 8},
               "cuda": {"layers": 4, "batch": 4, "prompt_len": 512, "tokens": 16}}


def options(model: str, device: str = "auto", **given) -> E2EOptions:
    """E2EOptions for a model on a device (auto resolved), each size not given from the device's defaults; a usage
    error names a bad model or value."""
    from pydantic import ValidationError

    from kopt import workloads
    from kopt.hardware import resolve_device

    m = workloads.load().model(model)  # unknown names: a usage error listing the valid ones
    dev = resolve_device(device)
    sizes = CPU_DEFAULTS if dev == "cpu" else CUDA_DEFAULTS
    vals = {k: v for k, v in given.items() if v is not None}
    if vals.get("page_size") == 0:
        vals.pop("page_size")
    try:
        o = E2EOptions(model=model, device=dev, **{**sizes, **vals})
    except ValidationError as e:
        err = e.errors()[0]
        flag = "--" + str(err["loc"][0]).replace("_", "-") if err["loc"] else "an option"
        raise UsageError(f"{flag}: {err['msg']}") from None
    check_context(o, m.max_context)
    return o


def small_check(device: str = "auto") -> E2EOptions:
    """The options of `kopt verify --e2e` on a device: SMALL_CHECK at SMALL_SIZES."""
    from kopt.hardware import resolve_device

    dev = resolve_device(device)
    return options(device=dev, **SMALL_CHECK, **SMALL_SIZES[dev])


def run(path: Path, o: E2EOptions, timeout_s: float = 600.0) -> E2EResult:
    """Run the e2e job in a child; its result (passed or failed: error_kind 'candidate'), or a UsageError (a missing
    transformers, a prompt longer than the model's context). A child that died or ran out of time is a failed run."""
    import importlib.util

    from kopt import proc

    if importlib.util.find_spec("transformers") is None:
        raise UsageError("kopt e2e needs Hugging Face transformers: pip install -e \".[e2e]\"")
    from kopt.e2e.child import Job

    with tempfile.TemporaryDirectory(prefix="kopt-e2e-") as tmp:
        job, out, log = Path(tmp) / "job.json", Path(tmp) / "result.json", Path(tmp) / "child.log"
        job.write_text(Job(candidate=str(path), options=o).model_dump_json())
        p = proc.run_logged(proc.python_module("kopt.e2e.child", str(job), str(out)), log, timeout_s)
        if out.is_file():
            res = E2EResult.model_validate_json(out.read_text())
        else:
            res = _died(o, p)
    if res.error_kind == "usage":
        raise UsageError(res.message)
    return res


def _died(o: E2EOptions, p) -> E2EResult:
    from kopt.profile.common import tail_lines

    if p.timed_out:
        return E2EResult(options=o, status=Status.timeout, error_kind="candidate",
                         message="the e2e run ran out of time (raise --timeout)")
    return E2EResult(options=o, status=Status.crash, error_kind="candidate",
                     message=f"the e2e run died (status {p.rc}): {tail_lines(p.output or 'no output')}")


def record(res: E2EResult, run_id: Optional[str] = None) -> None:
    """Append the run's ledger row (mode e2e) to the workspace's candidates.jsonl."""
    from kopt.paths import ledger_file
    from kopt.store import ledger

    ledger.append(ledger_file(), [res.row(run_id)])
