# Sourced: hosts in network namespaces of their own on one bridge, as pods
# on one node. Used by tests/netns_cluster.sh (a cluster over real virtual
# links) and bench/netns_cluster.sh (bench/scaling.sh's tcp-netns points).
# Needs root. Every function returns non-zero on the first step that fails.
#   netns_switch_up ID          the bridge br0, in namespace ${ID}sw
#   netns_host ID NAME ADDR     namespace ${ID}NAME, its eth0 at ADDR/24 on
#                               the bridge, loopback up
#   netns_all_down              kills what runs in them and removes them all

netns_made=()
netns_links=0

netns_switch_up() {  # netns_switch_up ID
  ip netns add "$1sw" || return 1
  netns_made+=("$1sw")
  ip -n "$1sw" link add br0 type bridge || return 1
  ip -n "$1sw" link set br0 up || return 1
  ip -n "$1sw" link set lo up
}

netns_host() {  # netns_host ID NAME ADDR
  local id=$1 ns=$1$2 addr=$3
  netns_links=$((netns_links + 1))
  local here="${id}v$netns_links" there="${id}b$netns_links"
  ip netns add "$ns" || return 1
  netns_made+=("$ns")
  ip link add "$here" type veth peer name "$there" || return 1
  ip link set "$here" netns "$ns" || return 1
  ip link set "$there" netns "${id}sw" || return 1
  ip -n "${id}sw" link set "$there" master br0 up || return 1
  ip -n "$ns" link set "$here" name eth0 || return 1
  ip -n "$ns" addr add "$addr/24" dev eth0 || return 1
  ip -n "$ns" link set eth0 up || return 1
  ip -n "$ns" link set lo up
}

netns_all_down() {
  local ns pid
  # $! of `cmd | sed &` is sed's: every process left in a namespace goes by
  # the namespace instead.
  for ns in "${netns_made[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
  done
  netns_made=()
  return 0
}
