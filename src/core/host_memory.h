// How much host memory this process may still take: what the kernel says
// is available (MemAvailable), or less where a cgroup caps the process.
#pragma once

#include <cstdint>

namespace tessera {

// Bytes; 0 when neither /proc/meminfo nor a cgroup says.
uint64_t AvailableHostMemory();

}  // namespace tessera
