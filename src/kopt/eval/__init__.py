"""Evaluate a candidate: compile, check and time it in isolated child processes, then judge the outputs here.

- `bench`     : `evaluate`, the one call behind `kopt bench`, `kopt verify` and `kopt peers`: rows of the ledger.
- `verdict`   : `kopt verify`: every perf case cold, the correctness matrix, hidden shapes; on an executor.
- `calibrate` : `kopt calibrate`: A/A runs, their spread stored by kopt.store.calibration; `noise`: a row's NOISY.
- `peers`     : the candidate against each peer kernel: the child's half and the parent's output check.
- `child`     : the parent's side of an evaluation child (`python -m kopt.eval.worker`), through kopt.proc.
- `jobs`      : what parent and child exchange: Job, SavedOutput, WorkerResult, Outcome, fresh seeds.
- `worker`    : the evaluation child: the phases of one job, each saved in result.json.
- `session`   : the one candidate session (load, tamper check, compile, checked call, timed call), shared
                by the evaluation child and the tuning child (kopt.tune.worker).
- `checks`    : the parent's output check against the fp32 reference, and the plausibility guard.
- `prewarm`   : a run's distinct kernels (through the candidate's device_plan) compiled ahead, in parallel.

The fp32 reference and the baselines' outputs never live in a child that runs candidate code.
"""

#: The public face: name -> the module holding it.
_FACE = {"BenchOptions": "bench", "evaluate": "bench", "evaluate_peers": "bench",
         "check_output": "checks", "heldout_draw": "verdict", "matrix_cases": "verdict",
         "Kernel": "prewarm", "distinct": "prewarm", "compile_all": "prewarm", "compile_kernel": "prewarm",
         "device_profile": "prewarm", "default_jobs": "prewarm", "warm_cases": "prewarm",
         "builds_without_gpu": "prewarm"}
__all__ = sorted(_FACE)


def __getattr__(name: str):
    """The public face, imported on first use: the evaluation child (`python -m kopt.eval.worker`) runs this
    package's __init__ and needs none of the parent's modules."""
    if name in _FACE:
        from importlib import import_module

        return getattr(import_module(f"kopt.eval.{_FACE[name]}"), name)
    raise AttributeError(f"module 'kopt.eval' has no attribute {name!r}")
