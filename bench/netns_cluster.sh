# Sourced by bench/scaling.sh: a cluster of Tessera's tcp shards, each in
# its own network namespace, measured by a `tessera bench --cluster` that
# runs its workers in a namespace of their own, so that every byte between
# a worker and a shard crosses two veth ends and a bridge, as between pods
# on one Kubernetes node (tests/engines/k8s_sim.py builds its pods alike).
# Needs root (ip netns; tools/netns.sh builds them). Names carry the
# script's pid, so concurrent runs do not meet; netns_down removes
# everything netns_up made.
#   netns_up MAX_SHARDS        the bridge, the workers' namespace, MAX_SHARDS shard namespaces
#   netns_bench SHARDS WORKERS BENCH_ARGS...
#                              starts the shards, runs the bench against them,
#                              waits for the shards to end (they stop once
#                              every worker has said goodbye, so one call runs
#                              either the calls or the step, not both)
#   netns_down
#   netns_in_shard I CMD...    runs CMD in shard I's namespace (address: netns_shard_ip I)
#   netns_in_workers CMD...    runs CMD in the workers' namespace

source "$(dirname "${BASH_SOURCE[0]}")/../tools/netns.sh"

netns_id="ts$(($$ % 100000))"
netns_subnet="10.250.$(($$ % 250))"
netns_port=5000

netns_up() {  # netns_up MAX_SHARDS
  netns_switch_up "$netns_id" || return 1
  netns_host "$netns_id" wk "$netns_subnet.2" || return 1
  local i
  for i in $(seq 0 $(($1 - 1))); do
    netns_host "$netns_id" "ps$i" "$(netns_shard_ip "$i")" || return 1
  done
  netns_secret=$(mktemp)
  "$tessera" secret --out "$netns_secret" --force >/dev/null
}

netns_down() {
  netns_all_down
  [ -z "${netns_secret:-}" ] || rm -f "$netns_secret"
}

netns_bench() {  # netns_bench SHARDS WORKERS BENCH_ARGS...
  local shards=$1 workers=$2 i
  shift 2
  netns_port=$((netns_port + 1))  # a fresh port each time: no listener left from the last
  local ps="" ws=""
  for i in $(seq 0 $((shards - 1))); do
    ps+="${ps:+,}$(netns_shard_ip "$i"):$netns_port"
  done
  for i in $(seq 0 $((workers - 1))); do ws+="${ws:+,}$netns_subnet.2:$((6000 + i))"; done
  local spec
  spec=$(mktemp)
  "${PYTHON:-python3}" -c 'import json, sys; print(json.dumps({"ps": sys.argv[1].split(","),
    "worker": sys.argv[2].split(",")}))' "$ps" "$ws" >"$spec"
  # Pinned as the bench pins the shards it starts: shards on the first
  # cores, the bench (its workers) on the last.
  local cpus pids=()
  cpus=$(nproc)
  for i in $(seq 0 $((shards - 1))); do
    netns_in_shard "$i" env TESSERA_SECRET_FILE="$netns_secret" \
      TESSERA_LOG_LEVEL=warn taskset -c $((cpus > 1 ? i % (cpus - 1) : 0)) \
      "$tessera" server --ps_hosts "$ps" --worker_hosts "$ws" --job ps --task "$i" \
      --staging-mib 160 --transport tcp --stop-when-workers-leave &
    pids+=($!)
  done
  local rc=0
  # The step's bound (fabric-put-read) from the workers' namespace to shard
  # 0's, across the bridge as the calls go.
  netns_in_workers "$tessera" bench --transport tcp --cluster "$spec" \
    --secret-file "$netns_secret" --shards "$shards" --workers "$workers" \
    --fabric-peer-netns "${netns_id}ps0" --fabric-peer-host "$(netns_shard_ip 0)" "$@" || rc=$?
  rm -f "$spec"
  # The shards end by themselves once every worker has said goodbye (exit
  # 0); one still there 30 s after the bench is stuck, and the point fails.
  # A bench that failed may never have connected: its shards go at once.
  local deadline=$((SECONDS + 30)) pid src
  ((rc == 0)) || deadline=$SECONDS
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then
      echo "netns_bench: shard $pid still running 30 s after the bench ended" >&2
      kill -9 "$pid" 2>/dev/null || true
    fi
    src=0
    wait "$pid" || src=$?
    if ((src != 0)); then
      echo "netns_bench: shard $pid ended with $src" >&2
      rc=1
    fi
  done
  return "$rc"
}

netns_shard_ip() { echo "$netns_subnet.$((10 + $1))"; }
netns_in_shard() {  # netns_in_shard I CMD...
  local i=$1
  shift
  ip netns exec "${netns_id}ps$i" "$@"
}
netns_in_workers() { ip netns exec "${netns_id}wk" "$@"; }
