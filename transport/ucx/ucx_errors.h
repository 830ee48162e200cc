// UCX status codes as Tessera Statuses.
#pragma once

#include <ucp/api/ucp.h>

#include <string>
#include <string_view>

#include "tessera/status.h"

namespace tessera::transport::ucx {

// `what` and UCX's words for `status`, with the code that fits it
// (unreachable peers Unavailable, timeouts DeadlineExceeded, ...).
// `what` is read only for an error: an operation that succeeded builds no
// message (every completed put and get passes here).
Status FromUcs(ucs_status_t status, std::string_view what);

}  // namespace tessera::transport::ucx
