// When Tessera lets UCX carry traffic over tcp. UCX's tcp transport emulates
// puts and gets in software and checks neither remote keys nor access flags:
// any host that reaches a UCX worker's tcp port can write registered memory
// (docs/security.md). So a UCX context whose UCX_TLS allows tcp may listen
// and connect on loopback addresses only, unless TESSERA_ALLOW_UCX_TCP=1
// says every host on the network is trusted. Tessera's own tcp transport
// (--transport tcp) is the one for networks.
#pragma once

#include <sys/socket.h>

#include <string>

#include "tessera/status.h"

namespace tessera::transport {

// Whether UCX_TLS (unset: "all") lets UCX use its tcp transport.
bool UcxTcpEnabled(const char* ucx_tls);
// OK, or why `action` ("listen on 10.0.0.5:7000") is refused.
Status CheckUcxTcpAllowed(const sockaddr_storage& addr, const std::string& action);

}  // namespace tessera::transport
