#!/usr/bin/env bash
# A shard busy with long bulk transfers over a slow link is not taken for a
# dead one. One ps and one worker, each in its own network namespace, joined
# by a veth pair shaped to 16 Mbit/s each way (tc tbf): the worker's 16 MiB
# tensor takes about 8 s to initialise, 8 s to push and 8 s to pull, and its
# heartbeats wait behind that data, while the heartbeat timeout is the
# default 5 s. The transfers' own completions are the shard's signs of life.
# Exit 77 = cannot run here (skip), saying why.
#
# usage: netns_throttled.sh TESSERA_BIN INTEGRATION_WORKER
set -u -o pipefail
tessera=$1
worker=$2
id=tt$$
net=10.232.$(( $$ % 250 )).
pids=()

cleanup() {
  # $! of `cmd | sed &` is sed's: every process left in a namespace goes by
  # the namespace instead (timeout and the server it started included).
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  for ns in "${id}ps" "${id}w"; do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  done
}
trap cleanup EXIT

if ! ip netns add "${id}ps" 2>/dev/null; then
  echo "cannot create network namespaces here (need root and CAP_SYS_ADMIN)"
  exit 77
fi
ip netns add "${id}w" || exit 77
ip link add "${id}a" type veth peer name "${id}b" || exit 77
ip link set "${id}a" netns "${id}ps"
ip link set "${id}b" netns "${id}w"
i=1
for h in ps w; do
  ns=${id}$h
  dev=$([ $h = ps ] && echo "${id}a" || echo "${id}b")
  ip -n "$ns" link set "$dev" name eth0
  ip -n "$ns" addr add "${net}$i/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  # A deep queue (latency 4 s): the link is slow, not lossy.
  if ! err=$(ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate 16mbit burst 32kb \
      latency 4s 2>&1); then
    echo "cannot shape a link here (tc tbf: $err)"
    exit 77
  fi
  i=$((i + 1))
done

export TESSERA_SECRET=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n') UCX_TLS=tcp
cluster="{\"ps\": [\"${net}1:7000\"], \"worker\": [\"${net}2:7000\"]}"
ip netns exec "${id}ps" timeout 240 "$tessera" server --ps_hosts "${net}1:7000" \
  --worker_hosts "${net}2:7000" --job ps --task 0 2>&1 | sed "s/^/[ps0] /" &
pids+=($!)
start=$(date +%s)
ip netns exec "${id}w" env TF_CONFIG="{\"cluster\": $cluster, \"task\": {\"type\": \"worker\", \"index\": 0}}" \
  timeout 200 "$worker" --tensors 1 --big-mib 16 --rounds 1 --chunk-kib 1024 2>&1 \
  | sed "s/^/[worker0] /" | tee "/tmp/${id}.log"
rc=${PIPESTATUS[0]}
took=$(( $(date +%s) - start ))
echo "the worker took ${took} s over the shaped link (heartbeat timeout 5 s)"
if [ "$rc" -ne 0 ]; then
  rm -f "/tmp/${id}.log"
  exit "$rc"
fi
# The transfers must really have outlasted the heartbeat timeout, or the test
# proves nothing.
if [ "$took" -lt 10 ]; then
  echo "FAIL: the link was not slow enough (${took} s): the test proves nothing"
  rm -f "/tmp/${id}.log"
  exit 1
fi
grep -q "verified 1 tensors" "/tmp/${id}.log"
rc=$?
rm -f "/tmp/${id}.log"
exit $rc
