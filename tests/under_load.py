"""Run the Ray and timing tests again and again beside a parallel CPU load: the check that they do not flake.

    python3 tests/under_load.py                       # 10 runs of the default files beside 2 busy processes
    python3 tests/under_load.py --runs 3 --load 4 tests/engine/tune/test_tune.py

Each run is `python3 -m pytest -q -p no:cacheprovider FILES` from the repository root (this checkout's src first on
PYTHONPATH); the busy processes (pure Python loops, one per --load) run at normal priority for the whole session and
are stopped at the end. One line per run, then a summary; exit status 1 if any run failed. Not a test module: pytest
does not collect it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: The tests whose checks rest on a real clock or a real cluster.
DEFAULT = ["tests/engine/executor/test_ray_executor.py", "tests/engine/timing/test_timing.py",
           "tests/engine/tune/test_tune.py"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10, help="pytest runs, one after the other (default 10)")
    ap.add_argument("--load", type=int, default=2, help="busy processes beside them (default 2)")
    ap.add_argument("files", nargs="*", default=DEFAULT, help=f"test files or node ids (default: {' '.join(DEFAULT)})")
    a = ap.parse_args(argv)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(x for x in (str(REPO / "src"), os.environ.get("PYTHONPATH"))
                                                       if x))
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.load)]
    failed = []
    try:
        for i in range(1, a.runs + 1):
            t0 = time.monotonic()
            p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *a.files], cwd=REPO,
                               env=env, capture_output=True, text=True)
            last = (p.stdout.strip().splitlines() or ["(no output)"])[-1]
            print(f"run {i}/{a.runs}: exit {p.returncode} in {time.monotonic() - t0:.0f} s, load "
                  f"{os.getloadavg()[0]:.1f}: {last}", flush=True)
            if p.returncode != 0:
                failed.append(i)
                print(p.stdout[-4000:], p.stderr[-2000:], sep="\n", flush=True)
    finally:
        for b in busy:
            b.kill()
            b.wait()
    print(f"{a.runs - len(failed)}/{a.runs} runs passed beside {a.load} busy processes"
          + (f"; failed: {', '.join(map(str, failed))}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
