// Liveness timeouts that fit the fabric and the host they run on.
//
// The right time to wait before calling a silent peer dead depends on the
// fabric (a throttled link moves a chunk slowly) and on the host (software
// emulation runs every step ten times slower). So each such timeout can be
// set from the environment, without rebuilding a trainer, and all of them
// are multiplied by one scale that a slow host's harness sets.
#pragma once

#include <chrono>

#include "tessera/status.h"

namespace tessera {

// TESSERA_TIMEOUT_SCALE, a factor > 0 (the Soft-RoCE VM's harness sets it
// under emulation); 1 when unset. An invalid value is an error naming it.
Result<double> TimeoutScale();

// The environment variable `name` in milliseconds when it is set, else
// `configured`; either way times TimeoutScale(). 0 stays 0 (off).
Result<std::chrono::milliseconds> TimeoutFromEnv(const char* name,
                                                 std::chrono::milliseconds configured);

}  // namespace tessera
