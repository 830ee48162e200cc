#!/usr/bin/env bash
# tessera run without an engine (TESSERA_RANK...): what each task is given
# by its place (NIC, GPU), a rank that never joins named by rank 0, a ps
# task whose worker never connects, and a task without the secret.
set -uo pipefail
: "${TESSERA_BIN:?}"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
"$TESSERA_BIN" secret --out "$dir/secret" 2> /dev/null
export TESSERA_SECRET_FILE=$dir/secret TESSERA_WORLD_SIZE=2

echo "== a worker's NIC and GPU by its place on the node"
export TESSERA_RENDEZVOUS=127.0.0.1:$(port)
for r in 0 1; do
  TESSERA_RANK=$r timeout 60 "$TESSERA_BIN" run --ps 1 --nics mlx5_0,mlx5_1 --gpus-per-node 2 \
    --server-arg=--workers-grace-s=1 -- \
    sh -c 'echo "TF_CONFIG=$TF_CONFIG"; env | grep -E "^(TESSERA_VERBS_DEVICE|UCX_NET_DEVICES|TESSERA_CUDA_DEVICE|TESSERA_TRANSPORT)="' \
    > "$dir/place$r.log" 2>&1 &
done
wait
cat "$dir/place1.log" | grep -v "^[0-9]"
for want in TESSERA_VERBS_DEVICE=mlx5_0 UCX_NET_DEVICES=mlx5_0:1 TESSERA_CUDA_DEVICE=0 \
  TESSERA_TRANSPORT=tcp '"task":{"index":0,"type":"worker"}'; do
  grep -qF "$want" "$dir/place1.log" || fail "the worker was not given $want"
done
# Its ps task waited for a worker that never connected, then said so.
grep -q "worker rank 0 never connected within 1 s of the start" "$dir/place0.log" ||
  { fail "the ps task did not name the worker that never came"; cat "$dir/place0.log"; }

echo "== a rank that never joins"
export TESSERA_RENDEZVOUS=127.0.0.1:$(port)
TESSERA_RANK=0 timeout 60 "$TESSERA_BIN" run --ps 1 --rendezvous-timeout 2 -- true \
  > "$dir/alone.log" 2>&1
rc=$?
grep -v "^[0-9]" "$dir/alone.log"
[ $rc -eq 1 ] || fail "rank 0 alone exited $rc"
grep -q "rank(s) 1 of 2 did not join the rendezvous within 2 s" "$dir/alone.log" ||
  fail "rank 0 did not name the missing rank"

echo "== no secret"
(unset TESSERA_SECRET_FILE TESSERA_SECRET
  TESSERA_RANK=0 "$TESSERA_BIN" run --ps 1 -- true > "$dir/nosecret.log" 2>&1
  echo "exit $?" >> "$dir/nosecret.log")
grep -q "every task needs the cluster secret, from the engine" "$dir/nosecret.log" &&
  grep -q "exit 2" "$dir/nosecret.log" || { fail "no secret: $(cat "$dir/nosecret.log")"; }
[ $fails -eq 0 ] && echo "run options: all passed"
exit $((fails > 0))
