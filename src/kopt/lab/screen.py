"""`kopt lab screen`: kernel configs paired against the candidate's own plan, case by case, in one process (GPU).

Each config is ABBA-paired with the candidate's default plan (its heuristic and tuning table) by kopt's own timer
(device-only cold spans, graph replays, the full stopping rule; quick: fewer samples), over three rotated input
sets. A config given as '+{...}' is laid over the case's resolved default plan instead of replacing it, so one switch
can be tried on a tuned shape. One line per pair: both runtimes, the gain (default / config, > 1: the config is
faster) with its 95% CI, and the config's plan; same_plan=1 marks a config that resolves to the case's default plan
(a switch the plan ignores there), so its pair is an A/A. Every output is checked against the fp32 reference first;
a config that fails is reported and skipped. A config with no result within `hang_s` seconds (a kernel that hangs
leaves the process's CUDA context unusable) is reported as HUNG and the process exits with HUNG_EXIT, so the next
screen, a new process, still runs.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from kopt.lab.configs import LabConfig, resolved_config, same_plan

#: Exit status of a screen ended by its watchdog (a config hung).
HUNG_EXIT = 3


def watchdog(seconds: float, line: str, emit: Callable[[str], None] = print) -> threading.Timer:
    """A started timer that emits `line` and ends the process with HUNG_EXIT unless cancelled first."""
    def fire():
        emit(line)
        for stream in (sys.stdout, sys.stderr):  # os._exit flushes nothing
            stream.flush()
        os._exit(HUNG_EXIT)

    t = threading.Timer(seconds, fire)
    t.daemon = True
    t.start()
    return t


def pair_line(case_id: int, label: str, pt, plan: dict, base_plan: dict) -> str:
    """The screen's line of one timed pair (pt: kopt.timing.PairTiming, the config as side a)."""
    return (f"case={case_id} config={label} us={pt.a.median_ms * 1e3:.2f} default_us={pt.b.median_ms * 1e3:.2f} "
            f"gain={pt.speedup:.4f} ci={pt.ci[0]:.4f}-{pt.ci[1]:.4f} replay={pt.a.replay} "
            f"same_plan={int(same_plan(plan, base_plan))} "
            f"plan={json.dumps(plan, sort_keys=True)} default_plan={json.dumps(base_plan, sort_keys=True)}")


def run(path: Path, cases: list, configs: list[LabConfig], quick: bool = False, hang_s: float = 240.0,
           emit: Callable[[str], None] = print) -> int:
    """Screen `configs` on `cases` (kopt.lab.common.pick_cases) with the candidate at `path`; lines go to `emit`.
    Returns 0 (a config that failed is a line of the screen, not an error)."""
    import torch

    from kopt import baselines, candidate
    from kopt.eval import check_output
    from kopt.lab.common import header, host_profile, plan_oracle, workloads
    from kopt.reference import reference
    from kopt.timing import TimingOptions, rotating, time_pair

    mod = candidate.load(path)
    keys = candidate.config_keys(path)
    opts = TimingOptions.for_device("cuda", quick=quick)
    page = (cases[0].variant.page_size or 0) if cases else 0
    emit(header(quick=quick, page=page))
    profile = host_profile()
    for case in cases:
        ws = workloads(case)
        base_plan = mod.plan_info(*ws[0].args(), **ws[0].kwargs(None))
        resolved = resolved_config(base_plan, keys)
        default = rotating(lambda w: mod.run(*w.args(), **w.kwargs(None)), ws)
        default()
        for c in configs:
            full = c.full(resolved, plan_oracle(mod, case, profile))
            dog = watchdog(hang_s, f"case={case.id} config={c.label} HUNG: no result in {hang_s:g} s "
                                   f"config={json.dumps(full, sort_keys=True)}", emit)
            try:
                out = mod.run(*ws[0].args(), **ws[0].kwargs(full))
                torch.cuda.synchronize()
                chk = check_output(out, reference(ws[0]), baselines.torch_attention(ws[0]), ws[0].q)
                if chk.status.value != "ok":
                    emit(f"case={case.id} config={c.label} INCORRECT {chk.detail}")
                    continue
                fn = rotating(lambda w, cfg=full: mod.run(*w.args(), **w.kwargs(cfg)), ws)
                pt = time_pair(fn, default, "cuda", opts)
            except Exception as e:  # the config's own failure: reported, the screen goes on
                emit(f"case={case.id} config={c.label} FAILED {type(e).__name__}: {str(e)[:200]}")
                continue
            finally:
                dog.cancel()
            plan = mod.plan_info(*ws[0].args(), **ws[0].kwargs(full))
            emit(pair_line(case.id, c.label, pt, plan, base_plan))
    return 0
