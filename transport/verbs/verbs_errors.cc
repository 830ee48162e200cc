#include "transport/verbs/verbs_errors.h"

#include <sys/resource.h>

#include <cerrno>
#include <cstring>

namespace tessera::transport::verbs {

std::string LockedMemoryLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0) return "unknown";
  if (limit.rlim_cur == RLIM_INFINITY) return "unlimited";
  return std::to_string(limit.rlim_cur / 1024) + " KiB";
}

Status RegistrationError(int err, size_t bytes, const std::string& what) {
  std::string msg = "registering " + std::to_string(bytes) + " bytes of " + what +
                    " with the RDMA device failed: " + std::strerror(err);
  if (err == ENOMEM || err == EPERM || err == EAGAIN) {
    msg += ". Registered memory is locked, and this process may lock " + LockedMemoryLimit() +
           " (ulimit -l); raise it (ulimit -l unlimited, LimitMEMLOCK=infinity under systemd, "
           "--ulimit memlock=-1 in docker)";
    return Status::ResourceExhausted(msg);
  }
  return Status::Internal(msg);
}

Status CompletionError(ibv_wc_status status, const std::string& peer, const char* op) {
  std::string msg = std::string(op) + " to " + peer + " failed: " + ibv_wc_status_str(status);
  switch (status) {
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
      return Status::Unavailable(msg + " (peer unreachable or gone)");
    case IBV_WC_WR_FLUSH_ERR:
      return Status::Unavailable(msg + " (the connection was closed)");
    case IBV_WC_REM_ACCESS_ERR:
      return Status::PermissionDenied(msg + " (the peer refused the key or the address range)");
    case IBV_WC_LOC_PROT_ERR:
    case IBV_WC_LOC_ACCESS_ERR:
      return Status::Internal(msg + " (local memory not registered for this access)");
    default:
      return Status::Internal(msg);
  }
}

}  // namespace tessera::transport::verbs
