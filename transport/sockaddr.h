// Socket addresses for the backends' connection managers (UCX's sockaddr
// listeners, rdma_cm): resolving, printing, and telling local peers apart.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/status.h"

namespace tessera::transport {

Result<sockaddr_storage> Resolve(const std::string& host, uint16_t port);
// "10.0.0.1:7000", "[fe80::1]:7000" (an IPv4-mapped IPv6 address as IPv4).
std::string SockaddrToString(const sockaddr_storage& addr);
// Every address `host` resolves to, numeric, without port or brackets; none
// when it does not resolve.
std::vector<std::string> NumericAddressesOf(const std::string& host);
socklen_t SockaddrLen(const sockaddr_storage& addr);
// True when addr is one of this host's addresses (loopback included).
bool IsLocalAddress(const sockaddr_storage& addr);
// True for 127.0.0.0/8 and ::1 only.
bool IsLoopbackAddress(const sockaddr_storage& addr);

}  // namespace tessera::transport
