#!/usr/bin/env bash
# Usage: scripts/run_bench.sh CASE [extra `kopt bench` args...]
# The Signal for one case: kopt bench --case CASE --cold-cache --machine [args]
set -euo pipefail
if [[ $# -lt 1 ]]; then
  echo "usage: $0 CASE [kopt bench args...]" >&2
  exit 2
fi
case_id=$1
shift
KOPT_ENV_QUIET=1 source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
kopt_run bench --case "$case_id" --cold-cache --machine "$@"
