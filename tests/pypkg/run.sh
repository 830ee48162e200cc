#!/usr/bin/env bash
# The Python package's pytest suite (tests/pypkg) as the one worker of a real
# cluster, 2 ps tasks, over each transport; exit 77 tells meson it skipped.
# Arguments, when given, replace the suite's directory (a file, -k ...).
set -euo pipefail
: "${TESSERA_BIN:?}"
here=$(cd "$(dirname "$0")" && pwd)
if [ -z "${TESSERA_PYTHON:-}" ]; then
  echo "SKIP: built without the Python package (-Dpython; it needs nanobind, see docs/python.md)"
  exit 77
fi
if ! "$TESSERA_PYTHON" -c "import pytest, numpy, torch" 2>/dev/null; then
  echo "SKIP: $TESSERA_PYTHON lacks pytest, numpy or torch (tools/dev.sh test makes .venv with them)"
  exit 77
fi
export PYTHONPATH="$TESSERA_PYTHONPATH${PYTHONPATH:+:$PYTHONPATH}"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for transport in ${TESSERA_TRANSPORTS:-tcp ucx}; do
  echo "== transport $transport"
  "$TESSERA_BIN" launch --ps 2 --workers 1 --transport "$transport" -- \
    "$TESSERA_PYTHON" -m pytest -q -p no:cacheprovider -x -rs "${@:-$here}" 2>&1 | tee "$log"
  # nanobind names every binding object still alive when the interpreter
  # exits: a reference the package (or a test) failed to let go of.
  if grep -q "nanobind: leaked" "$log"; then
    echo "FAIL: objects of the extension outlived the interpreter (above)"
    exit 1
  fi
done
