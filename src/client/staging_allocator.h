// First-fit allocator over a worker's staging slot on one shard. A range is
// busy from the moment gradients are put into it until the shard replied to
// the push that reads it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>

#include "core/bytes.h"
#include "core/pool_allocator.h"

namespace tessera::client {

class StagingAllocator {
 public:
  explicit StagingAllocator(uint64_t size = 0) { Reset(size); }
  void Reset(uint64_t size) {
    free_.clear();
    if (size) free_[0] = size;
    size_ = size;
  }
  uint64_t size() const { return size_; }

  std::optional<uint64_t> Allocate(uint64_t bytes) {
    bytes = AlignUp(bytes, 64);
    if (bytes == 0) bytes = 64;
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < bytes) continue;
      uint64_t offset = it->first, left = it->second - bytes;
      free_.erase(it);
      if (left) free_[offset + bytes] = left;
      used_[offset] = bytes;
      return offset;
    }
    return std::nullopt;
  }

  void Free(uint64_t offset) {
    auto u = used_.find(offset);
    if (u == used_.end()) return;
    uint64_t bytes = u->second;
    used_.erase(u);
    auto [it, inserted] = free_.emplace(offset, bytes);
    // Coalesce with the neighbours.
    if (auto next = std::next(it); next != free_.end() && it->first + it->second == next->first) {
      it->second += next->second;
      free_.erase(next);
    }
    if (it != free_.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == it->first) {
        prev->second += it->second;
        free_.erase(it);
      }
    }
  }

 private:
  uint64_t size_ = 0;
  // Their nodes come and go with every push: from the pool, not the heap.
  using Ranges =
      std::map<uint64_t, uint64_t, std::less<>, PoolAllocator<std::pair<const uint64_t, uint64_t>>>;
  Ranges free_;  // offset -> length
  Ranges used_;
};

}  // namespace tessera::client
