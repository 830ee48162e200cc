// Picking a TCP port for a server that is about to listen.
#pragma once

#include <cstdint>
#include <string>

namespace tessera {

// A port on `host` (an IPv4 address) that nothing is bound to right now,
// chosen at random *below* the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range): ports from that range are also
// handed to outgoing connections, which can take one between the pick and
// the server's bind. 0 when none was found (the caller's bind then fails
// loudly).
uint16_t PickListenPort(const std::string& host);

}  // namespace tessera
