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
#include <vector>

#include "tessera/status.h"

namespace tessera::transport {

// Whether UCX_TLS (unset: "all") lets UCX use its tcp transport.
bool UcxTcpEnabled(const char* ucx_tls);
// OK, or why `action` ("listen on 10.0.0.5:7000") is refused.
Status CheckUcxTcpAllowed(const sockaddr_storage& addr, const std::string& action);

// UCX opens its tcp interface on every network device UCX_NET_DEVICES lets
// it (all, unset), whatever address Tessera listens on: with a loopback
// cluster it still listened on the host's other addresses. So where UCX's
// tcp is on and TESSERA_ALLOW_UCX_TCP is not 1, the devices a context may
// use are: those UCX_NET_DEVICES names when none of them is a network
// interface other than loopback (refused otherwise, naming it); with
// UCX_NET_DEVICES unset, the loopback interfaces and the RDMA ports. The
// list to give UCX ("" : leave it), given the interfaces (name, loopback)
// and the RDMA ports ("mlx5_0:1") there are.
struct NetInterface {
  std::string name;
  bool loopback = false;
};
Result<std::string> UcxNetDevicesForTcpPolicy(const char* ucx_tls, const char* net_devices,
                                              const char* allow,
                                              const std::vector<NetInterface>& interfaces,
                                              const std::vector<std::string>& rdma_ports);
// The same, for this process's environment and this host's devices.
Result<std::string> UcxNetDevicesForTcpPolicy();

}  // namespace tessera::transport
