#!/bin/sh
# `tessera doctor` on this machine: its JSON must agree with what the system
# reports (tests/doctor_check.py); the plain output must name every check.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
"$TESSERA_BIN" doctor --json | python3 "$here/doctor_check.py"
out=$("$TESSERA_BIN" doctor || true)
for check in rdma-devices locked-memory ucx gpu-registration addresses; do
  echo "$out" | grep -q "$check:" || { echo "doctor's output lacks $check"; exit 1; }
done
