#include "core/placement.h"

#include <algorithm>
#include <string>

namespace tessera {

Result<PlacementPolicy> ParsePlacementPolicy(std::string_view name) {
  if (name == "round_robin" || name == "round-robin") return PlacementPolicy::kRoundRobin;
  if (name == "greedy" || name == "greedy_bytes") return PlacementPolicy::kGreedyBytes;
  return Status::InvalidArgument("unknown placement '" + std::string(name) +
                                 "' (expected round_robin or greedy)");
}

const char* PlacementPolicyName(PlacementPolicy policy) {
  return policy == PlacementPolicy::kRoundRobin ? "round_robin" : "greedy";
}

Placer::Placer(PlacementPolicy policy, int num_shards)
    : policy_(policy), bytes_(static_cast<size_t>(std::max(num_shards, 1)), 0) {}

int Placer::Place(uint64_t bytes, int pinned) {
  int shard;
  if (pinned >= 0) {
    shard = pinned;
  } else if (policy_ == PlacementPolicy::kRoundRobin) {
    shard = next_;
    next_ = (next_ + 1) % static_cast<int>(bytes_.size());
  } else {
    shard = static_cast<int>(std::min_element(bytes_.begin(), bytes_.end()) - bytes_.begin());
  }
  bytes_[static_cast<size_t>(shard)] += bytes;
  return shard;
}

}  // namespace tessera
