#!/usr/bin/env bash
# Gradients pushed as backward makes them vs after backward
# (bench/torch_overlap.py), 2 ps tasks x 2 workers, sync Adam.
#   bench/torch_overlap.sh [BUILD_DIR] [PYTHON] [TRANSPORT]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
python=${2:-$here/../.venv/bin/python}
transport=${3:-tcp}
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
"$build/tools/tessera" launch --ps 2 --workers 2 --transport "$transport" -- \
  "$python" "$here/torch_overlap.py" 2>/dev/null | grep '^\[worker0\] |' | sed 's/^\[worker0\] //'
