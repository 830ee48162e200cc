// Picking a TCP port for a server that is about to listen.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera {

// A port on `host` (an IPv4 address) that nothing is bound to right now,
// chosen at random *below* the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range): ports from that range are also
// handed to outgoing connections, which can take one between the pick and
// the server's bind. 0 when none was found (the caller's bind then fails
// loudly).
uint16_t PickListenPort(const std::string& host);
// `n` such ports, all different: the tasks of one cluster, picked before any
// of them listens (one pick at a time could hand two of them the same port).
std::vector<uint16_t> PickListenPorts(const std::string& host, size_t n);

}  // namespace tessera
