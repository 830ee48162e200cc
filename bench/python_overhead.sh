#!/usr/bin/env bash
# Python's share of a call, beside the same call from C++ (bench/python_overhead.py),
# over Tessera's tcp and over UCX's shared memory (UCX_TLS=posix,sysv,cma,tcp
# as `tessera bench` uses it): one markdown table.
#   bench/python_overhead.sh [BUILD_DIR] [PYTHON] [python_overhead.py options]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
python=${2:-$here/../.venv/bin/python}
shift $(($# < 2 ? $# : 2))
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
echo "| transport | size | call | Python µs/call | C++ µs/call, spaced as Python | Python − C++ µs | C++ back to back µs/call | spaced − back to back µs |"
echo "|---|---|---|---:|---:|---:|---:|---:|"
run() {  # run LABEL TRANSPORT [env...]
  local label=$1 transport=$2
  shift 2
  env "$@" "$build/tools/tessera" launch --ps 1 --workers 1 --transport "$transport" -- \
    "$python" "$here/python_overhead.py" --label "$label" "${extra[@]}" 2>/dev/null |
    sed -n "s/^\[worker0\] \(| $label |.*\)/\1/p"
}
extra=("$@")
run tcp tcp
run shm ucx UCX_TLS=posix,sysv,cma,tcp
