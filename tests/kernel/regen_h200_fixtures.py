"""Rewrite tests/fixtures/h200_plans.json and h200_sources.json after a kernel iteration that changes H200 plans on
purpose: every entry the current code plans or lowers differently is replaced, every other one is left as it is, and
the fixtures name the iteration and the keys it changed. Run from the repository root:

    PYTHONPATH=src python3 tests/kernel/regen_h200_fixtures.py --iteration 46

It lowers every distinct kernel of the fixtures for sm_90a (about 11 minutes on two cores); test_plan.py then checks
the new fixtures, and any later change against them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import test_plan as tp  # noqa: E402  (the helpers the fixtures are checked with: one copy of them)


def _plan_row(p, old: list, fields: list) -> list:
    """The h200_plans.json row of plan p, in the fixture's (pre-refactor) fields; fields the plan no longer has keep
    their old values (test_plan.test_h200_plans_are_unchanged reads each old field through the plan)."""
    row = dict(zip(fields, old))
    row.update({f: getattr(p, f) for f in ("balanced", "block_N", "comb_unroll", "d", "dtype", "even_split",
                                           "fast_math", "hkv", "hq", "num_splits", "paged", "pdl", "red_batch",
                                           "red_once", "scale", "threads", "tile_page", "v_split", "eager")})
    row.update({"page": p.page_size, "comb_smem": p.combine, "bal_combine": p.combine and bool(p.balanced),
                "last_cta": p.last_cta})
    return [row[f] for f in fields]


def _plans_text(fx: dict) -> str:
    """h200_plans.json as it is written: one top-level key a line, one plan a line."""
    head = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in fx.items() if k != "plans"]
    rows = ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in fx["plans"].items())
    return "{\n" + ",\n".join(head) + ',\n"plans": {\n' + rows + "\n}\n}\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iteration", type=int, required=True, help="the kernel iteration that changed the plans")
    args = ap.parse_args(argv)
    from kopt import wave64
    from kopt.hardware import profile

    rk = wave64.load_candidate(str(tp.SHIPPED))
    h200 = rk._dev.from_profile(profile("H200").model_dump())
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()

    pf = tp.FIXTURES / "h200_plans.json"
    plans = json.loads(pf.read_text())
    moved = []
    for key, old in plans["plans"].items():
        p = tp._plan(rk, h200, tp._bench_case(key))
        want = tp.fixture_plan(old, plans["fields"])
        if want != {f: getattr(p, f) for f in want}:
            plans["plans"][key] = _plan_row(p, old, plans["fields"])
            moved.append(key)
    if moved:  # a fixture names only the iterations that changed it
        plans.setdefault("changed", []).append({"iteration": args.iteration, "commit": commit, "keys": moved})
        pf.write_text(_plans_text(plans))
    print(f"h200_plans.json: {len(moved)} of {len(plans['plans'])} plans changed")

    sf = tp.FIXTURES / "h200_sources.json"
    src = json.loads(sf.read_text())
    cases = {k: tp._bench_case(k) for k in src["plans"]}
    cases |= tp._heldout_cases(src["heldout"]["seeds"], src["heldout"]["n"])
    kernels = tp._lower_all(cases)
    moved = []
    for key, case in cases.items():
        p = tp._plan(rk, h200, case)
        got = tp.digest(kernels[key], p.num_splits, p.fast_math)
        table = src["plans"] if key in src["plans"] else src["heldout"]["hashes"]
        if table[key] != got:
            table[key] = got
            moved.append(key)
    if moved:
        src.setdefault("changed", []).append({"iteration": args.iteration, "commit": commit, "keys": sorted(moved)})
        sf.write_text(json.dumps(src, indent=1) + "\n")
    print(f"h200_sources.json: {len(moved)} of {len(cases)} hashes changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
