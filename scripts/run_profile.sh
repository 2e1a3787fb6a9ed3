#!/usr/bin/env bash
# Usage: scripts/run_profile.sh CASE [extra `kopt profile` args, e.g. --tool ncu|torch|mcprofiler]
# kopt profile --case CASE [args]
set -euo pipefail
if [[ $# -lt 1 ]]; then
  echo "usage: $0 CASE [kopt profile args...]" >&2
  exit 2
fi
case_id=$1
shift
KOPT_ENV_QUIET=1 source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
kopt_run profile --case "$case_id" "$@"
