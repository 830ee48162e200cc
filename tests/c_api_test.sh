#!/usr/bin/env bash
# Runs tests/c_api_test.c as both workers of a real cluster (2 ps tasks, a
# checkpoint directory), over each transport.
set -euo pipefail
: "${TESSERA_BIN:?}" "${C_API_TEST:?}"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for transport in tcp ucx; do
  echo "== transport $transport"
  # Where the workers signal each other (c_api_test.c, wait_for_signal).
  export C_API_SIGNAL_DIR="$dir/signal-$transport"
  mkdir -p "$C_API_SIGNAL_DIR"
  "$TESSERA_BIN" launch --ps 2 --workers 2 --transport "$transport" \
    --checkpoint-dir "$dir/ckpt-$transport" -- "$C_API_TEST"
done
