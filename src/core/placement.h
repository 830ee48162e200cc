// Which shard owns a tensor (or a chunk of one). Decided in one place, the
// coordinator, so that every worker agrees whatever order it declares in.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "tessera/status.h"

namespace tessera {

enum class PlacementPolicy : uint8_t {
  kRoundRobin = 1,   // replica_device_setter's default
  kGreedyBytes = 2,  // the shard holding the fewest bytes
};

Result<PlacementPolicy> ParsePlacementPolicy(std::string_view name);
const char* PlacementPolicyName(PlacementPolicy policy);

class Placer {
 public:
  Placer(PlacementPolicy policy, int num_shards);
  // Picks a shard for `bytes`, or takes `pinned` (>= 0) as given.
  int Place(uint64_t bytes, int pinned = -1);
  const std::vector<uint64_t>& bytes_per_shard() const { return bytes_; }

 private:
  PlacementPolicy policy_;
  int next_ = 0;
  std::vector<uint64_t> bytes_;
};

}  // namespace tessera
