#!/usr/bin/env bash
# 2 shards and 3 workers, each in its own network namespace ("host"), joined
# by veth pairs to a bridge in a switch namespace: a cluster that talks over
# real (virtual) links, not loopback. Exit 77 = cannot run here (skip).
#
# usage: netns_cluster.sh TESSERA_BIN INTEGRATION_WORKER
set -u -o pipefail
tessera=$1
worker=$2
id=ts$$
net=10.231.$(( $$ % 250 )).
sw=${id}sw
hosts=(ps0 ps1 w0 w1 w2)
pids=()

cleanup() {
  # $! of `cmd | sed &` is sed's: every process left in a namespace goes by
  # the namespace instead (timeout and the server it started included).
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  for h in "${hosts[@]}"; do
    ip netns pids "${id}$h" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "${id}$h" 2>/dev/null
  done
  ip netns del "$sw" 2>/dev/null
}
trap cleanup EXIT

if ! ip netns add "$sw" 2>/dev/null; then
  echo "cannot create network namespaces here (need root and CAP_SYS_ADMIN)"
  exit 77
fi
ip -n "$sw" link add br0 type bridge || exit 77
ip -n "$sw" link set br0 up
ip -n "$sw" link set lo up
i=1
for h in "${hosts[@]}"; do
  ns=${id}$h
  ip netns add "$ns"
  ip link add "${id}$i" type veth peer name "${id}p$i" || exit 77
  ip link set "${id}$i" netns "$ns"
  ip link set "${id}p$i" netns "$sw"
  ip -n "$sw" link set "${id}p$i" master br0 up
  ip -n "$ns" link set "${id}$i" name eth0
  ip -n "$ns" addr add "${net}$i/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  i=$((i + 1))
done

ps_hosts="${net}1:7000,${net}2:7000"
worker_hosts="${net}3:7000,${net}4:7000,${net}5:7000"
export TESSERA_SECRET=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n') UCX_TLS=tcp
cluster="{\"ps\": [\"${net}1:7000\", \"${net}2:7000\"], \"worker\": [\"${net}3:7000\", \"${net}4:7000\", \"${net}5:7000\"]}"

for t in 0 1; do
  ip netns exec "${id}ps$t" timeout 240 "$tessera" server --ps_hosts "$ps_hosts" \
    --worker_hosts "$worker_hosts" --job ps --task "$t" 2>&1 | sed "s/^/[ps$t] /" &
  pids+=($!)
done
wpids=()
for t in 0 1 2; do
  ip netns exec "${id}w$t" env TF_CONFIG="{\"cluster\": $cluster, \"task\": {\"type\": \"worker\", \"index\": $t}}" \
    timeout 200 "$worker" 2>&1 | sed "s/^/[worker$t] /" &
  wpids+=($!)
done
rc=0
for p in "${wpids[@]}"; do
  wait "$p" || rc=1
done
# Each worker's pipeline exit status is sed's; check the worker's own verdicts.
exit $rc
