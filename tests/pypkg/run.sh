#!/usr/bin/env bash
# The Python package's pytest suite (tests/pypkg) as the one worker of a real
# cluster, 2 ps tasks, over each transport; exit 77 tells meson it skipped.
# Arguments, when given, replace the suite's directory (a file, -k ...).
set -euo pipefail
: "${TESSERA_BIN:?}"
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=python_env.sh
. "$here/python_env.sh"
require_python_modules pytest numpy torch
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
