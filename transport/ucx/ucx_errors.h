// UCX status codes as Tessera Statuses.
#pragma once

#include <ucp/api/ucp.h>

#include <string>

#include "tessera/status.h"

namespace tessera::transport::ucx {

// `what` and UCX's words for `status`, with the code that fits it
// (unreachable peers Unavailable, timeouts DeadlineExceeded, ...).
Status FromUcs(ucs_status_t status, const std::string& what);

}  // namespace tessera::transport::ucx
