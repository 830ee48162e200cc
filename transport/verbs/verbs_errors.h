// What went wrong, in words a user can act on: failed registrations (with the
// locked-memory limit named) and failed work completions.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <string>

#include "tessera/status.h"

namespace tessera::transport::verbs {

// ibv_reg_mr failed with `err` for `bytes` bytes of `what`.
Status RegistrationError(int err, size_t bytes, const std::string& what);

// A work request to `peer` completed with `status`.
Status CompletionError(ibv_wc_status status, const std::string& peer, const char* op);

// The RLIMIT_MEMLOCK soft limit as `ulimit -l` would show it ("unlimited", "8192 KiB").
std::string LockedMemoryLimit();

}  // namespace tessera::transport::verbs
