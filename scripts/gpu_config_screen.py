"""Pair kernel configs against the candidate's own plan, case by case, in one process (a GPU dev screen).

    python3 scripts/gpu_config_screen.py --cases 10,14,18 --configs 'nopdl={"pdl": 0};bn128={"block_N": 128}'

Each config is ABBA-paired with the candidate's default plan (its heuristic and tuning table) by kopt's own
timer (device-only cold spans, graph replays, the full stopping rule; --quick for fewer samples), over three
rotated input sets. A config given as '+{...}' (a leading plus) is laid over the case's resolved default plan
instead of replacing it, so one switch can be tried on a tuned shape. Prints one line per pair: both runtimes,
the gain (default / config, > 1: the config is faster) with its 95% CI, and the config's plan; same_plan=1 marks a
config that resolves to the case's default plan (a switch the plan ignores there), so its pair is an A/A. Every
output is checked against the fp32 reference first; a config that fails is reported and skipped. A config with no result
within --hang-s seconds (a kernel that hangs leaves the process's CUDA context unusable) is reported as HUNG and
the screen exits with 3, so the next screen line, a new process, still runs.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


#: plan_info fields that describe the call, not a config key (the rest of a plan is its config, laid under '+{..}')
PLAN_ONLY = ("path", "paged", "page_size")


def parse_configs(text: str) -> list[tuple[str, dict, bool]]:
    """'label=JSON;label=+JSON' -> [(label, config, over_default)]; a bad entry raises ValueError."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        label, sep, body = part.partition("=")
        if not sep or not label.strip():
            raise ValueError(f"config {part!r}: want label=JSON")
        over = body.strip().startswith("+")
        cfg = json.loads(body.strip().lstrip("+"))
        if not isinstance(cfg, dict):
            raise ValueError(f"config {label!r}: want a JSON object")
        out.append((label.strip(), cfg, over))
    return out


def resolved_config(mod, plan: dict) -> dict:
    """A resolved plan (the candidate's plan_info) as the config that pins it: what '+{..}' is laid over. A plan field
    that is no config key of the candidate (derived) is left out."""
    keys = getattr(mod, "_CFG_KEYS", None)
    return {k: int(v) if isinstance(v, bool) else v for k, v in plan.items()
            if k not in PLAN_ONLY and (keys is None or k in keys)}


def same_plan(plan: dict, default_plan: dict) -> bool:
    """Whether a config's resolved plan is the default plan: then the kernels are the same and the pair an A/A."""
    return plan == default_plan


def watchdog(seconds: float, line: str):
    """A started timer that prints `line` and ends the process with exit code 3 unless cancelled first."""
    import threading

    def fire():
        print(line, flush=True)
        os._exit(3)

    t = threading.Timer(seconds, fire)
    t.daemon = True
    t.start()
    return t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", required=True, help="case ids: 10,14 or 1-18")
    ap.add_argument("--configs", required=True, help="';'-separated label=JSON (label=+JSON: over the default plan)")
    ap.add_argument("--page-size", type=int, default=0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--hang-s", type=float, default=240.0, help="a config's limit (check + timing), seconds")
    a = ap.parse_args(argv)
    try:
        configs = parse_configs(a.configs)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sys.path.insert(0, os.path.join(ROOT, "src"))
    from kopt import hardware

    hardware.exit_unless_cuda(os.path.basename(__file__))  # a GPU tool on a host without one: one line, exit 2
    import torch

    from kopt import baselines, candidate
    from kopt.cases import load_cases, select
    from kopt.cli.common import parse_ids
    from kopt.eval import checks
    from kopt.reference import reference
    from kopt.timing import TimingOptions, rotating, time_pair
    from kopt.workload import make_workload

    mod = candidate.load(os.path.join(ROOT, "solution", "tilelang", "run_kernel.py"))
    opts = TimingOptions.for_device("cuda", quick=a.quick)
    dev = hardware.detect("cuda")
    print(f"device={dev.name} commit={os.environ.get('KOPT_COMMIT', 'unknown')} quick={a.quick} page={a.page_size}")
    for case in select(load_cases(), parse_ids(a.cases)):
        case = case.with_variant(page_size=a.page_size)
        ws = [make_workload(case, seed, "cuda") for seed in (0, 1, 2)]
        base_plan = mod.plan_info(*ws[0].args(), **ws[0].kwargs(None))
        resolved = resolved_config(mod, base_plan)
        default = rotating(lambda w: mod.run(*w.args(), **w.kwargs(None)), ws)
        default()
        for label, cfg, over in configs:
            full = {**resolved, **cfg} if over else cfg
            dog = watchdog(a.hang_s, f"case={case.id} config={label} HUNG: no result in {a.hang_s:g} s "
                                     f"config={json.dumps(full, sort_keys=True)}")
            try:
                out = mod.run(*ws[0].args(), **ws[0].kwargs(full))
                torch.cuda.synchronize()
                chk = checks.check_output(out, reference(ws[0]), baselines.torch_attention(ws[0]), ws[0].q)
                if chk.status.value != "ok":
                    print(f"case={case.id} config={label} INCORRECT {chk.detail}", flush=True)
                    continue
                fn = rotating(lambda w, c=full: mod.run(*w.args(), **w.kwargs(c)), ws)
                pt = time_pair(fn, default, "cuda", opts)
            except Exception as e:  # report and go on
                print(f"case={case.id} config={label} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
                continue
            finally:
                dog.cancel()
            plan = mod.plan_info(*ws[0].args(), **ws[0].kwargs(full))
            print(f"case={case.id} config={label} us={pt.a.median_ms * 1e3:.2f} default_us={pt.b.median_ms * 1e3:.2f} "
                  f"gain={pt.speedup:.4f} ci={pt.ci[0]:.4f}-{pt.ci[1]:.4f} replay={pt.a.replay} "
                  f"same_plan={int(same_plan(plan, base_plan))} "
                  f"plan={json.dumps(plan, sort_keys=True)} default_plan={json.dumps(base_plan, sort_keys=True)}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
