#!/usr/bin/env bash
# kopt environment.
#   source scripts/env.sh   -> defines `kopt_run` (and `kopt` if it is not installed) in this shell
#   bash scripts/env.sh     -> prints `kopt doctor`
# When kopt is not installed, src/ is put on PYTHONPATH and kopt runs as `python3 -m kopt`.
# KOPT_ENV_QUIET=1 skips the doctor report (the other wrappers set it). PYTHON overrides python3.

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail   # executed: strict mode; when sourced, leave the caller's shell options alone
fi

KOPT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export KOPT_ROOT

if command -v kopt >/dev/null 2>&1 && [[ "$(type -t kopt)" == "file" ]]; then
  kopt_run() { command kopt "$@"; }
else
  case ":${PYTHONPATH:-}:" in
    *":${KOPT_ROOT}/src:"*) ;;
    *) export PYTHONPATH="${KOPT_ROOT}/src${PYTHONPATH:+:${PYTHONPATH}}" ;;
  esac
  kopt_run() { "${PYTHON:-python3}" -m kopt "$@"; }
  if [[ "${BASH_SOURCE[0]}" != "$0" ]] && ! declare -F kopt >/dev/null; then
    kopt() { kopt_run "$@"; }
  fi
fi

if [[ "${KOPT_ENV_QUIET:-0}" != "1" ]]; then
  _kopt_rc=0
  kopt_run doctor || _kopt_rc=$?
  if [[ $_kopt_rc -ne 0 ]]; then
    echo "env.sh: kopt doctor exited with status ${_kopt_rc}" >&2
    if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then exit "$_kopt_rc"; fi
  fi
  unset _kopt_rc
fi
