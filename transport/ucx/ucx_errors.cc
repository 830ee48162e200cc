#include "transport/ucx/ucx_errors.h"

namespace tessera::transport::ucx {

Status FromUcs(ucs_status_t status, std::string_view what) {
  if (status == UCS_OK) return Status::Ok();
  std::string msg = std::string(what) + ": " + ucs_status_string(status);
  switch (status) {
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_IO_ERROR:
      return Status::Unavailable(msg);
    case UCS_ERR_CANCELED:
      return Status::Aborted(msg);
    case UCS_ERR_TIMED_OUT:
      return Status::DeadlineExceeded(msg);
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_NO_RESOURCE:
    case UCS_ERR_EXCEEDS_LIMIT:
      return Status::ResourceExhausted(msg);
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
      return Status::InvalidArgument(msg);
    case UCS_ERR_UNSUPPORTED:
      return Status::Unimplemented(msg);
    default:
      return Status::Internal(msg);
  }
}

}  // namespace tessera::transport::ucx
