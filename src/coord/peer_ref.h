// How the coordinator's service names its peers: a connection as the
// hosting server knows it (opaque here), and a worker as it authenticated.
#pragma once

#include <cstdint>
#include <string>

namespace tessera::coord {

using PeerId = uintptr_t;

// A worker that addresses the coordinator, as authenticated by the host.
struct WorkerRef {
  static constexpr uint32_t kNoRank = ~uint32_t{0};
  PeerId peer = 0;
  std::string task;
  uint32_t rank = 0;    // kNoRank for a reader
  bool reader = false;  // a read-only client: looks tensors up, waits, reads the step
};

}  // namespace tessera::coord
