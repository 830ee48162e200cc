// The congestion control of Tessera's tcp sockets (ContextOptions::
// tcp_congestion, TESSERA_TCP_CONGESTION): set on each socket, checked once
// per context, and reported by `tessera doctor` (ProbeTcpCongestion).
#pragma once

#include <string>

#include "tessera/status.h"

namespace tessera::transport::tcp {

// The host's default (net.ipv4.tcp_congestion_control).
std::string HostCongestion();

// What Tessera's sockets are to get: `option` (ContextOptions::
// tcp_congestion), else TESSERA_TCP_CONGESTION; empty for the host's.
std::string ChosenCongestion(const std::string& option);

// Sets `name` on the socket; nothing for an empty name. 0 or -1 (errno).
int SetCongestion(int fd, const std::string& name);

// Whether this process may set `name`, tried on a socket of its own; the
// error names what is available and what needs no privilege.
Status CheckCongestion(const std::string& name);

}  // namespace tessera::transport::tcp
