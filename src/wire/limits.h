// What one cluster may declare. A declare is an authenticated worker's
// request, but its sizes are still the peer's word: these bound the records
// the coordinator builds for it and the chunks a ps task creates, so no
// declare can exhaust either's memory.
#pragma once

#include <cstdint>

namespace tessera::wire {

struct DeclareLimits {
  uint64_t max_chunks_per_tensor = 1u << 16;
  uint64_t max_tensors = 1u << 18;
  uint64_t max_chunks = 1u << 21;
  uint64_t max_tensor_bytes = uint64_t{1} << 44;  // 16 TiB
};

}  // namespace tessera::wire
