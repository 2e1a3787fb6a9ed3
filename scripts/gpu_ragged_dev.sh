#!/usr/bin/env bash
# One GPU session for the work-balanced kernel: prewarm, the new GPU tests, old vs new timing on the
# ragged and split cases (quick, cold L2), then the rest of the GPU test matrix within a time cap.
# Usage (from the workspace root): OLD=path/to/old/solution/tilelang/run_kernel.py bash scripts/gpu_ragged_dev.sh
set -uo pipefail
OUTD=${OUT:-/tmp/ragged-dev}
mkdir -p "$OUTD"
T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
el prewarm
python3 scripts/prewarm_kernels.py --jobs 16 --configs '{"balanced":1,"bal_per_sm":4};{"balanced":1,"bal_per_sm":1};{"balanced":1}' 2>&1 | tail -4
el "new GPU tests"
timeout 120 python3 -m pytest -m gpu -q -x tests/test_kernel_gpu.py -k "ragged_batches or cuda_graph" 2>&1 | tail -15
el "bench new"
B="python3 -m kopt bench --cold-cache --quick --no-record --machine"
$B --case 15,16,17,18,8,11,12,13 2>/dev/null | tee "$OUTD/bench_new.txt"
el "bench old"
$B --case 15,16,17,18,8,11,12,13 --candidate "$OLD" 2>/dev/null | tee "$OUTD/bench_old.txt"
for cfg in '{"balanced":1,"bal_per_sm":4}' '{"balanced":1,"bal_per_sm":1}' '{"balanced":1}'; do
  el "bench new $cfg"
  $B --case 15,16,17,18 --config "$cfg" 2>/dev/null | tee -a "$OUTD/bench_cfg.txt"
done
el "bench paged 16/256 (new)"
$B --case 15,17,18 --page-size 16 2>/dev/null | tee -a "$OUTD/bench_paged.txt"
$B --case 15,17,18 --page-size 256 2>/dev/null | tee -a "$OUTD/bench_paged.txt"
LEFT=$(( ${BUDGET_S:-400} - ($(date +%s) - T0) - 10 ))
el "GPU test matrix (cap ${LEFT} s)"
[ "$LEFT" -gt 20 ] && timeout "$LEFT" python3 -m pytest -m gpu -q tests/test_kernel_gpu.py 2>&1 | tail -25
el done
