#include "transport/ucx/ucx_tcp_policy.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
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

}  // namespace tessera::transport
