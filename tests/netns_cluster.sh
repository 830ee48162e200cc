#!/usr/bin/env bash
# 2 shards and 3 workers, each in its own network namespace ("host"), joined
# by veth pairs to a bridge in a switch namespace: a cluster that talks over
# real (virtual) links, not loopback. Exit 77 = cannot run here (skip).
#
# usage: netns_cluster.sh TESSERA_BIN INTEGRATION_WORKER
set -u -o pipefail
tessera=$1
worker=$2
source "$(dirname "$0")/../tools/netns.sh"
id=ts$$
net=10.231.$(( $$ % 250 )).
hosts=(ps0 ps1 w0 w1 w2)
pids=()

cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  netns_all_down
}
trap cleanup EXIT

if ! netns_switch_up "$id" 2>/dev/null; then
  echo "cannot create network namespaces here (need root and CAP_SYS_ADMIN)"
  exit 77
fi
i=1
for h in "${hosts[@]}"; do
  netns_host "$id" "$h" "${net}$i" || exit 77
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
