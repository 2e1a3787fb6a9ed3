#!/usr/bin/env bash
# `kopt tune` on a CUDA GPU, bounded; logs, the tuning table and a summary end up in OUTDIR.
#   usage: bash scripts/gpu_tune_check.sh OUTDIR [STEP ...]
# Steps (default: case10 allquick lookup):
#   case10    kopt tune --case 10                     (every config, full timing; the wall time is the figure)
#   allquick  kopt tune --all --max-configs $K --quick  (the budget run; K defaults to 4)
#   all       kopt tune --all                         (every config of every case; bounded by ALL_LIMIT_S)
#   lookup    what the candidate-side lookup returns for each case shape on this GPU
#   compile   does parallel prewarm pay? case 10, 8 configs, quick, empty TileLang caches:
#             --compile-jobs 0 then --compile-jobs 8 (compare the two wall times); writes no table rows
# Environment: DEVICE (default cuda), K (configs per case in allquick, default 4), GPUS (--gpus, e.g. all),
#   CASE_LIMIT_S (default 300), ALL_LIMIT_S (default 1200 = the 20-minute bound), TUNE_ARGS (extra args).
# Each step prints `STEP rc=.. wall_s=..` on stderr and in OUTDIR/logs/steps.txt; per-case tune times
# are the `kopt tune: case N: ... in X s` lines of OUTDIR/logs/<step>.err.
set -u
out=${1:?usage: gpu_tune_check.sh OUTDIR [STEP ...]}; shift
mkdir -p "$out/logs"
steps=${*:-case10 allquick lookup}
export PYTHONUNBUFFERED=1 KOPT_WORKSPACE=${KOPT_WORKSPACE:-$PWD}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
log=$out/logs
dev=${DEVICE:-cuda}
gpus=(--device "$dev")
[[ -n "${GPUS:-}" ]] && gpus+=(--gpus "$GPUS")
extra=()
[[ -n "${TUNE_ARGS:-}" ]] && read -r -a extra <<<"$TUNE_ARGS"
k=(python3 -m kopt)
run() {  # run NAME LIMIT_S CMD...: stdout/stderr to logs, wall time and rc to steps.txt
  local name=$1 lim=$2; shift 2
  local t0; t0=$(date +%s.%N)
  timeout "$lim" "$@" >"$log/$name.out" 2>"$log/$name.err"; local rc=$?
  awk -v n="$name" -v rc="$rc" -v t0="$t0" -v t1="$(date +%s.%N)" -v lim="$lim" \
    'BEGIN { printf "%s rc=%s wall_s=%.1f limit_s=%s\n", n, rc, t1 - t0, lim }' | tee -a "$log/steps.txt" >&2
  grep -h '^TUNE' "$log/$name.out" >&2
  grep -h '^kopt' "$log/$name.err" >&2
}
for s in $steps; do case $s in
  case10)   run tune_case10 "${CASE_LIMIT_S:-300}" "${k[@]}" tune --case 10 "${gpus[@]}" "${extra[@]}" ;;
  allquick) run tune_all_quick "${ALL_LIMIT_S:-1200}" "${k[@]}" tune --all --max-configs "${K:-4}" --quick \
              "${gpus[@]}" "${extra[@]}" ;;
  all)      run tune_all "${ALL_LIMIT_S:-1200}" "${k[@]}" tune --all "${gpus[@]}" "${extra[@]}" ;;
  lookup)   run lookup 120 python3 - "$dev" <<'EOF'
import sys
import torch
sys.path.insert(0, "solution/tilelang")
import tuning_lookup as tl
from kopt.cases import load_cases
from kopt.workload import make_workload
print("table", tl.table_path())
for c in load_cases():
    w = make_workload(c, 0, sys.argv[1])
    print(f"case {c.id}: {tl.lookup_for(w.q, w.k_cache, w.block_table)}")
    del w
EOF
            cat "$log/lookup.out" >&2 ;;
  compile)  for j in 0 8; do
              TILELANG_CACHE_DIR=$(mktemp -d) run "compile_jobs$j" "${CASE_LIMIT_S:-300}" "${k[@]}" tune --case 10 \
                --max-configs 8 --quick --compile-jobs "$j" --no-write --no-record "${gpus[@]}"
            done ;;
  *) echo "unknown step $s" >&2 ;;
esac; done
cp results/*/tuning.csv "$out/logs/" 2>/dev/null
cp candidates.jsonl "$out/logs/" 2>/dev/null
true
