#include "transport/ucx/ucx_tcp_policy.h"

#include <cstdlib>
#include <sstream>

#include "transport/sockaddr.h"

namespace tessera::transport {

bool UcxTcpEnabled(const char* ucx_tls) {
  if (ucx_tls == nullptr || *ucx_tls == '\0') return true;  // UCX's default: all
  std::string list = ucx_tls;
  const bool excluding = list.front() == '^';
  if (excluding) list.erase(0, 1);
  std::istringstream in(list);
  std::string item;
  bool named = false;
  while (std::getline(in, item, ',')) {
    if (item == "tcp" || (!excluding && item == "all")) named = true;
  }
  return excluding ? !named : named;
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
