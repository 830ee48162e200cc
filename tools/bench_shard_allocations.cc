// The shards' allocations per call: each shard process counts its heap
// allocations and says the count in its status; the bench asks every shard
// before and after the timed calls over one observer connection each.
// Asking costs the shard allocations of its own (decoding the question,
// building the JSON, sending it), measured once and taken off.
#include <algorithm>
#include <limits>

#include "tools/bench_internal.h"

namespace tessera::tools::bench {

std::optional<uint64_t> LocalCluster::ShardAllocationsNow() {
  if (shard_addresses_.empty()) return std::nullopt;
  if (observers_.empty()) {
    for (const TaskAddress& a : shard_addresses_) {
      auto observer = Observer::Connect(backend_, a, secret_, std::chrono::seconds(10));
      if (!observer.ok()) {
        fprintf(stderr, "bench: cannot count %s's allocations: %s\n", a.ToString().c_str(),
                observer.status().ToString().c_str());
        shard_addresses_.clear();  // do not try again
        observers_.clear();
        return std::nullopt;
      }
      observers_.push_back(std::move(*observer));
    }
  }
  uint64_t sum = 0;
  for (auto& observer : observers_) {
    auto status = observer->AskStatus();
    if (!status.ok() || !status->contains("heap_allocations") ||
        !(*status)["heap_allocations"].is_number_unsigned()) {
      return std::nullopt;
    }
    sum += (*status)["heap_allocations"].get<uint64_t>();
  }
  return sum;
}

void LocalCluster::MarkShardAllocations() {
  marked_.reset();
  if (observers_.empty()) {
    // First use: one question's cost, between two reads of every shard's
    // count (the rest of one question after its read, the next up to its
    // read); the least of a few, since a heartbeat may land in between.
    auto previous = ShardAllocationsNow();
    if (!previous) return;
    uint64_t least = std::numeric_limits<uint64_t>::max();
    for (int i = 0; i < 5; ++i) {
      auto now = ShardAllocationsNow();
      if (!now) return;
      least = std::min(least, *now - *previous);
      previous = now;
    }
    cost_of_asking_ = least;
  }
  marked_ = ShardAllocationsNow();
}

std::optional<double> LocalCluster::ShardAllocationsPerCall(uint64_t calls) {
  if (!marked_ || calls == 0) return std::nullopt;
  auto now = ShardAllocationsNow();
  if (!now) return std::nullopt;
  const uint64_t made = *now - *marked_;
  const uint64_t by_calls = made > cost_of_asking_ ? made - cost_of_asking_ : 0;
  return static_cast<double>(by_calls) / static_cast<double>(calls);
}

}  // namespace tessera::tools::bench
