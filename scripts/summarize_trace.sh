#!/usr/bin/env bash
# Usage: scripts/summarize_trace.sh FILE [extra `kopt trace summarize` args...]
# kopt trace summarize FILE   (torch-profiler / CUPTI / mcTracer trace)
set -euo pipefail
if [[ $# -lt 1 ]]; then
  echo "usage: $0 FILE [kopt trace summarize args...]" >&2
  exit 2
fi
trace_file=$1
shift
if [[ ! -f "$trace_file" ]]; then
  echo "$0: no such file: $trace_file" >&2
  exit 2
fi
KOPT_ENV_QUIET=1 source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
kopt_run trace summarize "$trace_file" "$@"
