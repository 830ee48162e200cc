#include "transport/ucx/ucx_tcp_policy.h"

#include <net/if.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "transport/sockaddr.h"

namespace tessera::transport {

bool UcxTcpEnabled(const char* ucx_tls) {
  if (ucx_tls == nullptr) return true;  // UCX's default: all
  // UCX's grammar: an optional leading '^' (all but the list), then names
  // separated by commas, each perhaps with a qualifier after ':' ("tcp:aux",
  // tcp for wire-up only, is still tcp), in any case, with spaces around.
  std::string list = ucx_tls;
  const auto first = list.find_first_not_of(" \t");
  if (first == std::string::npos) return true;  // empty: UCX's default
  const bool excluding = list[first] == '^';
  if (excluding) list.erase(0, first + 1);
  std::istringstream in(list);
  std::string item;
  bool tcp_named = false, all_named = false;
  while (std::getline(in, item, ',')) {
    item = item.substr(0, item.find(':'));
    const auto b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    item = b == std::string::npos ? "" : item.substr(b, e - b + 1);
    std::transform(item.begin(), item.end(), item.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (item == "tcp") tcp_named = true;
    if (item == "all") all_named = true;
  }
  return excluding != (tcp_named || all_named);
}

Status CheckUcxTcpAllowed(const sockaddr_storage& addr, const std::string& action) {
  if (IsLoopbackAddress(addr) || !UcxTcpEnabled(std::getenv("UCX_TLS"))) return Status::Ok();
  const char* allow = std::getenv("TESSERA_ALLOW_UCX_TCP");
  if (allow != nullptr && std::string(allow) == "1") return Status::Ok();
  return Status::FailedPrecondition(
      action + " with UCX, whose UCX_TLS (" +
      (std::getenv("UCX_TLS") ? std::string(std::getenv("UCX_TLS")) : std::string("unset: all")) +
      ") allows its tcp transport: UCX tcp checks neither memory keys nor access flags, so any "
      "host that reaches it could write parameters (docs/security.md). Use --transport tcp "
      "(Tessera's own), restrict UCX_TLS to shared memory and RDMA (e.g. UCX_TLS=rc,sm), or set "
      "TESSERA_ALLOW_UCX_TCP=1 on a network where every host is trusted");
}

Result<std::string> UcxNetDevicesForTcpPolicy(const char* ucx_tls, const char* net_devices,
                                              const char* allow,
                                              const std::vector<NetInterface>& interfaces,
                                              const std::vector<std::string>& rdma_ports) {
  if (!UcxTcpEnabled(ucx_tls) || (allow != nullptr && std::string(allow) == "1"))
    return std::string();
  auto loopback = [&](const std::string& name) -> std::optional<bool> {
    for (const auto& i : interfaces) {
      if (i.name == name) return i.loopback;
    }
    return std::nullopt;  // not a network interface (an RDMA port, a typo)
  };
  if (net_devices != nullptr && *net_devices != '\0') {
    std::istringstream in(net_devices);
    std::string item;
    while (std::getline(in, item, ',')) {
      const bool all = item == "all";
      if (all || loopback(item) == false) {
        return Status::FailedPrecondition(
            "UCX_NET_DEVICES=" + std::string(net_devices) + " lets UCX open its tcp transport on " +
            (all ? std::string("every network interface") : "'" + item + "'") +
            ", which checks neither memory keys nor access flags (docs/security.md): name "
            "loopback and RDMA devices only, take tcp out of UCX_TLS, use --transport tcp, or set "
            "TESSERA_ALLOW_UCX_TCP=1 on a network where every host is trusted");
      }
    }
    return std::string();
  }
  std::string out;
  for (const auto& i : interfaces) {
    if (i.loopback) out += (out.empty() ? "" : ",") + i.name;
  }
  for (const auto& port : rdma_ports) out += (out.empty() ? "" : ",") + port;
  return out;
}

Result<std::string> UcxNetDevicesForTcpPolicy() {
  std::vector<NetInterface> interfaces;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/sys/class/net", ec)) {
    std::ifstream flags(e.path() / "flags");
    unsigned long value = 0;
    flags >> std::hex >> value;
    interfaces.push_back({e.path().filename().string(), (value & IFF_LOOPBACK) != 0});
  }
  std::vector<std::string> rdma_ports;
  for (const auto& dev : std::filesystem::directory_iterator("/sys/class/infiniband", ec)) {
    std::error_code port_ec;
    for (const auto& port : std::filesystem::directory_iterator(dev.path() / "ports", port_ec)) {
      rdma_ports.push_back(dev.path().filename().string() + ":" + port.path().filename().string());
    }
  }
  return UcxNetDevicesForTcpPolicy(std::getenv("UCX_TLS"), std::getenv("UCX_NET_DEVICES"),
                                   std::getenv("TESSERA_ALLOW_UCX_TCP"), interfaces, rdma_ports);
}

}  // namespace tessera::transport
