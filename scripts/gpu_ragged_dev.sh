#!/usr/bin/env bash
# One GPU session for the work-balanced kernel: prewarm, the new GPU tests, old vs new timing on all
# cases (quick, cold L2), variants of the balanced kernel on the ragged cases, paged 16/256, then GPU
# tests selected by TESTS_K within a time cap.
# Usage (from the workspace root): OLD=path/to/old/solution/tilelang/run_kernel.py bash scripts/gpu_ragged_dev.sh
set -uo pipefail
OUTD=${OUT:-ragged-dev-out}
mkdir -p "$OUTD"
T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
VARIANTS=${VARIANTS:-'{"balanced":1,"q_loop":1};{"balanced":1,"bal_combine":0};{"balanced":1,"block_N":128};{"balanced":1,"q_loop":1,"block_N":128};{"balanced":1,"bal_per_sm":3}'}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
el prewarm
python3 scripts/prewarm_kernels.py --jobs 16 --configs "$VARIANTS" 2>&1 | grep -E "FAILED|prewarm:"
el "new GPU tests"
timeout 150 python3 -m pytest -m gpu -q -x tests/test_kernel_gpu.py -k "ragged_batches or cuda_graph" 2>&1 | tail -15
B="python3 -m kopt bench --cold-cache --quick --no-record --machine"
el "bench new"
$B --case 1-18 2>/dev/null | tee "$OUTD/bench_new.txt"
el "bench old"
$B --case 1-18 --candidate "$OLD" 2>/dev/null | tee "$OUTD/bench_old.txt"
IFS=';' read -ra VS <<< "$VARIANTS"
for cfg in "${VS[@]}"; do
  el "bench new $cfg"
  $B --case 15,16,17,18 --config "$cfg" 2>/dev/null | sed "s/^/CFG:$cfg /" | tee -a "$OUTD/bench_cfg.txt"
done
el "bench paged 16/256 (new)"
for pg in 16 256; do $B --case 15,16,17,18 --page-size $pg 2>/dev/null | tee -a "$OUTD/bench_paged.txt"; done
LEFT=$(( ${BUDGET_S:-400} - ($(date +%s) - T0) - 8 ))
el "GPU tests -k '${TESTS_K:-}' (cap ${LEFT} s)"
[ "$LEFT" -gt 20 ] && timeout "$LEFT" python3 -m pytest -m gpu -q tests/test_kernel_gpu.py ${TESTS_K:+-k "$TESTS_K"} 2>&1 | tail -25
el done
