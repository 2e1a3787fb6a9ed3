#!/usr/bin/env bash
# Everything the recorded H200 results rest on, in one bounded run; logs and ledger rows end up in
# OUTDIR/campaign.tgz.   usage: bash scripts/h200_campaign.sh OUTDIR [STEP ...]
# CAMPAIGN_PACK=1: OUTDIR keeps only campaign.tgz and steps.txt (the logs live in the archive), for a machine that
#   hands back few files.
# Steps (default: all, in this order): doctor prewarm wall bench bf16 paged256 calibrate repeat12 ncu12
#   profile paged64 paged16 gputests verify report
#   report: kopt plot + kopt report (+ --screenshot where Chromium is installed: a PNG to look at, git-ignored) from the ledger just written,
#   so results/ never holds figures of older rows.
# Extra steps: timingtests (GPU timing + adversarial tests), bench5 (five bench --all), graphcheck
#   (scripts/gpu_graph_check.py against the ledger's rows), aa (A/A on AA_CASES), wall3 / wall3own (case 10 wall time x3, taking kept children / each its own,
#   rows recorded with their phases),
#   verifyat (kopt verify of each candidate file in VERIFY_AT), benchcases (bench of BENCH_CASES, default 1-3: the edge cases no verdict times), peers (kopt peers --all, FA3 from .gpu-peers/), ab (fused vs unfused split+combine on cases 8,10,13,14), stash / restore (keep results/
#   and the ledger in $STASH between two runs on one host), overhead (scripts/gpu_timing_overhead.py: the
#   harness's own start-up and per-sample costs), flushstudy (scripts/gpu_flush_study.py: what each kind
#   of cold-cache flush costs the timed call), benchzero (bench --all with the zeroing
#   flush, for a same-commit comparison with the default read flush), screen (configs on a few cases, quick: SCREEN_CONFIGS,
#   SCREEN_CASES, SCREEN_ARGS e.g. "--page-size 64"), untuned (bench --all with an empty tuning table), tuneall (kopt tune --all), tunecases (kopt tune --case TUNE_CASES),
#   cfgscreen (CFG_SCREEN: a screen file, scripts/gpu_config_screen.py), walljson, gcimport (the child's imports,
#   cyclic GC on / off), startup (scripts/gpu_child_startup.py),
#   ragpaged (cases 15-18 in RAGPAGED_SIZES-token pages, default 16 256), kerneltests (tests/test_kernel_gpu.py in
#   parallel shards; after prewarm), readbound (scripts/gpu_read_bound.py: the fastest pure read of each case's
#   bytes paired with the candidate, READBOUND_CASES, default 4-18; READBOUND_LAYOUTS e.g. 0,16,256: the per-layout read),
#   codewarm (scripts/gpu_code_warm.py: what instruction fetch from a cold L2 costs each of CODEWARM_CASES, default 4,5,6,10;
#   CODEWARM_CONFIG: a JSON config), timeline (scripts/gpu_kernel_timeline.py --floor: each kernel's start and end inside
#   a cold call, and the plan-shaped read + combine floor of a split plan, TIMELINE_CASES, default 10,14,5,4).
# The paged steps time quickly unless PAGED_QUICK= (empty: full timing); PAGED256_CASES (default 1-14).
#   More tuning runs: scripts/gpu_tune_check.sh.
set -u
out=${1:?usage: h200_campaign.sh OUTDIR [STEP ...]}; shift
mkdir -p "$out/logs"
steps=${*:-doctor prewarm wall bench bf16 paged256 calibrate repeat12 ncu12 profile paged64 paged16 gputests verify report}
stash=${STASH:-/tmp/kopt-stash}
export PYTHONUNBUFFERED=1 KOPT_WORKSPACE=$PWD
log=$out/logs
deadline=$(( $(date +%s) + ${CAMPAIGN_BUDGET_S:-3600} ))   # steps past the budget are skipped
run() {  # run NAME LIMIT_S CMD...: stdout/stderr to logs, wall time and rc appended
  local name=$1 lim=$2; shift 2
  local left=$(( deadline - $(date +%s) ))
  if (( left < 20 )); then echo "$name skipped (budget)" | tee -a "$log/steps.txt" >&2; return; fi
  (( lim > left )) && lim=$left
  local t0=$(date +%s%N)
  timeout "$lim" "$@" >"$log/$name.out" 2>"$log/$name.err"; local rc=$?
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '%s rc=%s wall_s=%d.%03d\n' "$name" "$rc" $((ms / 1000)) $((ms % 1000)) | tee -a "$log/steps.txt" >&2
}
for s in $steps; do case $s in
  doctor)    run doctor 60 python3 -m kopt doctor --json ;;
  prewarm)   # PREWARM_CONFIGS (default: SCREEN_CONFIGS less 'default'): also compiled for the 14 cases
             pc=${PREWARM_CONFIGS:-$(tr ';' '\n' <<< "${SCREEN_CONFIGS:-}" | grep -v '^default$' | paste -sd';')}
             run prewarm 300 python3 scripts/prewarm_kernels.py --configs "$pc" --cases "${PREWARM_CASES:-}" ;;
  gputests)  # GPUTESTS_K: a pytest -k expression (a subset, when device time is short)
             run gputests 420 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests ${GPUTESTS_K:+-k "$GPUTESTS_K"} ;;
  kerneltests) # tests/test_kernel_gpu.py in KERNELTESTS_SHARDS (default 6) pytest processes side by side
             # (KOPT_TEST_SHARD, tests/conftest.py: their kernels compile in parallel); -v, so a shard cut short
             # still says what passed. Run prewarm first: a test's kernel otherwise compiles on demand (~10 s).
             # KERNELTESTS_K: a pytest -k expression (a subset of the matrix, e.g. one switch's tests by name; a
             # word inside 'pytestmark', such as 'tma', matches every marked test)
             # KERNELTESTS_TEST_S (default 150): one test's limit (pytest-timeout, where installed), so a kernel that
             # hangs fails with its traceback and the shard goes on, instead of the shard's limit ending it unsaid
             # kerneltests_summary.txt: a count per outcome, and the selected tests no shard reached (the budget or a
             # shard's limit cut it short), from one --collect-only of the same selection; kerneltests_left.txt: their
             # node ids, one a line. KERNELTESTS_NODES: a file of node ids (such as a kerneltests_left.txt copied into
             # the tree) to run instead of the whole file, so a second run finishes what the first did not reach
             n=${KERNELTESTS_SHARDS:-6}; pids=(); tmo=(); nodes=(tests/test_kernel_gpu.py)
             if [[ -n ${KERNELTESTS_NODES:-} ]]; then
               mapfile -t nodes < <(grep -v '^[[:space:]]*$' "$KERNELTESTS_NODES" 2>/dev/null)
               if (( ${#nodes[@]} == 0 )); then  # never the whole suite by mistake
                 echo "kerneltests skipped: KERNELTESTS_NODES=$KERNELTESTS_NODES names no test" | tee -a "$log/steps.txt" >&2
                 continue
               fi
             fi
             run kerneltests_collect 60 python3 -m pytest -m gpu --collect-only -q -p no:cacheprovider \
               "${nodes[@]}" ${KERNELTESTS_K:+-k "$KERNELTESTS_K"}
             python3 -c "import pytest_timeout" 2>/dev/null && tmo=(--timeout "${KERNELTESTS_TEST_S:-150}")
             for i in $(seq 0 $((n - 1))); do
               KOPT_TEST_SHARD="$i/$n" run "kerneltests_$i" "${KERNELTESTS_LIMIT_S:-500}" python3 -m pytest -m gpu -v -rfE \
                 -p no:cacheprovider "${tmo[@]}" "${nodes[@]}" ${KERNELTESTS_K:+-k "$KERNELTESTS_K"} &
               pids+=($!)
             done
             wait "${pids[@]}"
             cat "$log"/kerneltests_[0-9]*.out | grep -E " (PASSED|FAILED|ERROR|SKIPPED)" | awk '{print $2}' | sort \
               | uniq -c > "$log/kerneltests_summary.txt"
             comm -23 <(grep -E '^tests/[^ ]+::[^ ]+$' "$log/kerneltests_collect.out" | sort -u) \
               <(cat "$log"/kerneltests_[0-9]*.out | grep -oE '^tests/[^ ]+::[^ ]+ (PASSED|FAILED|ERROR|SKIPPED)' \
                 | awk '{print $1}' | sort -u) > "$log/kerneltests_left.txt"
             sel=$(grep -Eo '^[0-9]+(/[0-9]+)? tests? collected' "$log/kerneltests_collect.out" 2>/dev/null | grep -Eo '^[0-9]+')
             done_n=$(awk '{s += $1} END {print s + 0}' "$log/kerneltests_summary.txt")
             if [[ -n $sel ]]; then printf '%7d NOT_REACHED (of %d selected)\n' $(( sel - done_n )) "$sel"
             else echo "     NA NOT_REACHED: the selection could not be counted (kerneltests_collect)"; fi \
               >> "$log/kerneltests_summary.txt" ;;
  ab)        run ab_fused0 150 python3 -m kopt bench --case 8,10,13,14 --cold-cache --machine --quick \
               --config '{"fused": 0}' ;;
  overhead)  run overhead 240 python3 scripts/gpu_timing_overhead.py ;;
  flushstudy) run flushstudy 300 python3 scripts/gpu_flush_study.py ;;
  screen)    # SCREEN_CONFIGS: ';'-separated JSON configs ('default' = no --config) on SCREEN_CASES, quick timing
             IFS=';' read -ra cfgs <<< "${SCREEN_CONFIGS:-default}"; i=0
             for c in "${cfgs[@]}"; do
               if [[ $c == default ]]; then set -- ; else set -- --config "$c"; fi
               run "screen_$i" 300 python3 -m kopt bench --case "${SCREEN_CASES:-8,10,13,14}" --cold-cache --machine \
                 ${SCREEN_QUICK---quick} --no-record ${SCREEN_ARGS:-} "$@"
               echo "screen_$i config=$c" >> "$log/steps.txt"; i=$((i + 1))
             done ;;
  stash)     mkdir -p "$stash"; cp -r results candidates.jsonl "$stash/" ;;
  restore)   if [[ -d $stash/results ]]; then cp -rn "$stash/results/." results/; cp "$stash/candidates.jsonl" .; fi ;;
  wall)      run wall_compile 120 python3 -m kopt bench --case 10 --cold-cache --machine --no-record
             for i in 1 2 3; do run wall_warm_$i 60 python3 -m kopt bench --case 10 --cold-cache --machine --json; done ;;
  bench)     run bench_fp16 420 python3 -m kopt bench --all --cold-cache --machine ;;
  benchcases) run bench_cases 300 python3 -m kopt bench --case "${BENCH_CASES:-1-3}" --cold-cache --machine ;;  # edge cases by default
  benchzero) run bench_fp16_zero 420 python3 -m kopt bench --all --cold-cache --flush zero --machine ;;
  untuned)   # the same bench with an empty tuning table: every case on the kernel's own heuristic (the kernel reads
             # no environment, so the table itself is swapped for its header, then put back)
             cp results/tilelang/tuning.csv "$out/tuned.csv" && head -1 "$out/tuned.csv" > results/tilelang/tuning.csv
             run bench_untuned 420 python3 -m kopt bench --all --cold-cache --machine
             cp "$out/tuned.csv" results/tilelang/tuning.csv ;;
  tuneall)   run tune_all 560 python3 -m kopt tune --all ;;
  tunecases) run tune_cases 560 python3 -m kopt tune --case "${TUNE_CASES:?TUNE_CASES: case ids}" ;;
  bf16)      run bench_bf16 300 python3 -m kopt bench --all --cold-cache --machine --dtype bf16 --quick ;;
  paged256)  run bench_paged256 300 python3 -m kopt bench --case "${PAGED256_CASES:-1-14}" --cold-cache --machine \
               --page-size 256 ${PAGED_QUICK---quick} ;;
  ragpaged)  # the ragged cases in 16- and 256-token pages (RAGPAGED_SIZES), full timing, recorded
             for pg in ${RAGPAGED_SIZES:-16 256}; do
               run "bench_ragged_p$pg" 240 python3 -m kopt bench --case 15-18 --cold-cache --machine --page-size "$pg"; done ;;
  paged64)   run bench_paged64 300 python3 -m kopt bench --case 7-14 --cold-cache --machine --page-size 64 ${PAGED_QUICK---quick} ;;
  paged16)   run bench_paged16 300 python3 -m kopt bench --case 7-14 --cold-cache --machine --page-size 16 ${PAGED_QUICK---quick} ;;
  calibrate) run calibrate 300 python3 -m kopt calibrate --case 10,12 --json ;;
  repeat12)  for i in 1 2 3 4 5; do run repeat12_$i 120 python3 -m kopt bench --case 12 --cold-cache --machine; done ;;
  ncu12)     run ncu12_fa2 300 python3 -m kopt profile --case 12 --tool ncu --candidate bench/fa2_candidate.py --json ;;
  profile)   # PROFILE_CASES (default "10 12"); PROFILE_PAGES: page sizes profiled too (0 = contiguous only)
             for c in ${PROFILE_CASES:-10 12}; do for p in ${PROFILE_PAGES:-0}; do
               run "profile${c}_p$p" 300 python3 -m kopt profile --case "$c" --tool ncu --page-size "$p" --json
             done; done ;;
  verify)    run verify 600 python3 -m kopt verify --machine --technique "${VERIFY_TECHNIQUE:-shipped}" \
               --hypothesis "${VERIFY_HYPOTHESIS:-the shipped kernel passes the verdict on the H200}" ;;
  timingtests) run timing_tests 300 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests/test_timing.py tests/test_adversarial.py ;;
  bench5)    # BENCH_N invocations (default 5) of bench --all; BENCH_CANDIDATE: another candidate file; BENCH_ARGS: more
             # bench flags (e.g. "--timing-sets 4")
             for i in $(seq "${BENCH_N:-5}"); do run "bench_all_$i" 300 python3 -m kopt bench --all --cold-cache --machine \
               ${BENCH_CANDIDATE:+--candidate "$BENCH_CANDIDATE"} ${BENCH_ARGS:-}; done ;;
  graphcheck) run graph_check 300 python3 scripts/gpu_graph_check.py --cases "${GRAPH_CASES:-1-18}" \
               --ledger candidates.jsonl --out "$log/graph-check.md" ${BENCH_CANDIDATE:+--candidate "$BENCH_CANDIDATE"} ;;
  readbound) run read_bound 420 python3 scripts/gpu_read_bound.py --cases "${READBOUND_CASES:-4-18}" \
               --out "$log/read-bound.md" ${READBOUND_LAYOUTS:+--layouts "$READBOUND_LAYOUTS"} ;;
  timeline)  # TIMELINE_CONFIGS: configs timed in place beside each case's plan (--configs; unset: pdl 0)
             run timeline 300 python3 scripts/gpu_kernel_timeline.py --cases "${TIMELINE_CASES:-10,14,5,4}" --floor \
               --out "$log/timeline.md" ${TIMELINE_CONFIGS+--configs "$TIMELINE_CONFIGS"} ;;
  codewarm)  run code_warm 300 python3 scripts/gpu_code_warm.py --cases "${CODEWARM_CASES:-4,5,6,10}" \
               ${CODEWARM_CONFIG:+--config "$CODEWARM_CONFIG"} ;;
  aa)        run aa 300 python3 -m kopt calibrate --case "${AA_CASES:-5,10,15}" --json ;;
  wall3)     # recorded, as a user runs it: each row's overhead_s says which phase took the time (a run after the
             # first takes the child the one before left: overhead_s.child_kept)
             for i in 1 2 3; do run "wall_$i" 60 python3 -m kopt bench --case 10 --cold-cache --machine; done ;;
  gcimport)  # the evaluation child's start-up imports (torch, tilelang) with cyclic GC on and off, alternated,
             # without bytecode (as $PYTHONDONTWRITEBYTECODE leaves them) and from a bytecode cache filled first
             pyc=/tmp/kopt-gcimport-pyc; env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=$pyc python3 -c \
               "import torch, tilelang" >/dev/null 2>&1
             for i in 1 2; do for c in none cached; do for g in on off; do
               pre=(env); [[ $c == cached ]] && pre=(env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=$pyc)
               run "gcimport_${c}_${g}_$i" 60 "${pre[@]}" python3 -c "
import gc, time
if '$g' == 'off': gc.disable()
t = time.perf_counter(); import torch; a = time.perf_counter(); import tilelang; b = time.perf_counter()
print('bytecode $c gc $g torch %.2f tilelang %.2f total %.2f' % (a - t, b - a, b - t))"
             done; done; done
             cat "$log"/gcimport_*.out > "$log/gcimport_summary.txt" ;;
  wall3own)  # the same, each run starting its own child (KOPT_KEEP_WARM_S=0)
             for i in 1 2 3; do KOPT_KEEP_WARM_S=0 run "wallown_$i" 60 python3 -m kopt bench --case 10 --cold-cache \
               --machine; done ;;
  verifyat|verifyat2)  # VERIFY_AT / VERIFY_AT2: candidate files to verify in turn (older iterations unpacked
             # beside the tree); VERIFY_AT_TECHNIQUE / VERIFY_AT_HYPOTHESIS label the first file of VERIFY_AT (the
             # others, and every file without them, are labelled re-verify; VERIFY_TECHNIQUE is the verify step's own)
             files=${VERIFY_AT:-}; [[ $s == verifyat2 ]] && files=${VERIFY_AT2:-}
             for f in $files; do
               tech="re-verify"; hyp="the same-session verdict of an earlier iteration"
               if [[ $s == verifyat && $f == "${files%% *}" && -n ${VERIFY_AT_TECHNIQUE:-} ]]; then
                 tech=$VERIFY_AT_TECHNIQUE; hyp=${VERIFY_AT_HYPOTHESIS:-$hyp}; fi
               # without KOPT_COMMIT: its rows name no commit (an unpacked copy holds no tracked file), not this tree's
               run "verify_$(basename "$(dirname "$(dirname "$(dirname "$f")")")")" 600 \
                 env -u KOPT_COMMIT python3 -m kopt verify "$f" --machine --technique "$tech" --hypothesis "$hyp"
             done ;;
  report)    run plot 180 python3 -m kopt plot
             shot=; command -v chromium >/dev/null && shot=--screenshot
             run report 180 python3 -m kopt report $shot ;;
  peers)     # FA3 forward from .gpu-peers/ (bf16, contiguous); its archive carries no package metadata
             if [[ -f .gpu-peers/site-fa3.tar.xz ]]; then
               mkdir -p /tmp/kopt-peers/fa3_fwd-0.0.3.dist-info && tar -C /tmp/kopt-peers -xJf .gpu-peers/site-fa3.tar.xz
               printf 'Metadata-Version: 2.1\nName: fa3-fwd\nVersion: 0.0.3\n' > /tmp/kopt-peers/fa3_fwd-0.0.3.dist-info/METADATA
             fi
             ( export PYTHONPATH=/tmp/kopt-peers:$PYTHONPATH; run peers 420 python3 -m kopt peers --all --dtype "${PEERS_DTYPE:-bf16}" ) ;;
  cfgscreen) # CFG_SCREEN: a file of lines "CASES<tab>CONFIGS[<tab>ARGS]" (scripts/gpu_config_screen.py), '#'
             # comments; ARGS (e.g. --page-size 16) come after CFG_SCREEN_ARGS, so one file can screen several layouts;
             # a line's configs (explicit, or laid over each case's plan: '+{..}') are compiled first, in parallel
             i=0
             while IFS=$'\t' read -r cs cf la <&3; do
               [[ -z $cs || $cs == \#* ]] && continue
               args="${CFG_SCREEN_ARGS:-} ${la:-}"
               pc=$(tr ';' '\n' <<< "$cf" | sed -n 's/^[^=]*=\(+\{0,1\}{.*\)$/\1/p' | paste -sd';')
               ps=$(sed -n 's/.*--page-size[ =]\([0-9]*\).*/\1/p' <<< "$args")  # the line's layout (its last --page-size)
               [[ -n $pc ]] && run "cfgprewarm_$i" 240 python3 scripts/prewarm_kernels.py --configs "$pc" --cases "$cs" \
                 ${ps:+--page-size "$ps"}
               # shellcheck disable=SC2086  # args: words
               run "cfgscreen_$i" 300 python3 scripts/gpu_config_screen.py --cases "$cs" --configs "$cf" $args
               echo "cfgscreen_$i cases=$cs configs=$cf${la:+ args=$la}" >> "$log/steps.txt"; i=$((i + 1))
             done 3< "${CFG_SCREEN:?CFG_SCREEN: the screen file}" ;;
  startup)   run child_startup 120 python3 scripts/gpu_child_startup.py --runs "${STARTUP_RUNS:-2}" ;;  # child_warm's steps
  walljson)  # case 10 wall time x3 with --json (every phase of kopt's own in each log)
             for i in 1 2 3; do run "walljson_$i" 60 python3 -m kopt bench --case 10 --cold-cache --machine --json --no-record; done ;;
  prewarmv)  # PREWARM_ARGS: more prewarm_kernels.py flags (--bf16 for peers).
             # What bench --all and verify need, for the shipped candidate and each folder in PREWARM_AT (a
             # copy of an older iteration's workspace: its solution/ and results/tilelang/tuning.csv), in parallel
             for d in ${PREWARM_AT:-}; do cp -r src scripts bench "$d/"; done
             pids=(); j=$(( $(nproc) / (1 + $(wc -w <<< "${PREWARM_AT:-}")) ))
             for d in . ${PREWARM_AT:-}; do
               run "prewarm_$(basename "$(cd "$d" && pwd)")" 240 python3 "$d/scripts/prewarm_kernels.py" --verify --jobs "$j" \
                 ${PREWARM_ARGS:-} &
               pids+=($!)
             done
             wait "${pids[@]}" ;;
  *) echo "unknown step $s" >&2 ;;
esac; done
cp candidates.jsonl "$out/logs/" 2>/dev/null
mkdir -p results
tar czf "$out/campaign.tgz" -C "$out" logs -C "$PWD" results
if [[ ${CAMPAIGN_PACK:-} == 1 ]]; then cp "$log/steps.txt" "$out/" 2>/dev/null; rm -rf "$log"; fi
