#!/usr/bin/env bash
# Usage: scripts/run_all.sh [extra `kopt bench` args...]
# Every case, cold L2: kopt bench --all --cold-cache [args]   (add --machine for parseable lines)
set -euo pipefail
KOPT_ENV_QUIET=1 source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
kopt_run bench --all --cold-cache "$@"
