// A registered buffer that small chunks bound for one shard's staging slot
// are copied into, side by side as they lie in the slot, so that they travel
// in one put instead of one each. Per put, a fabric may pay a frame, a
// completion and (verbs, for memory it does not know) a registration; for a
// 4 KiB chunk that can cost far more than copying it. Which chunks are small
// enough is the fabric's to say (Endpoint::GatherPutsUpTo): over UCX's shared
// memory a put is itself one copy, and gathering first made it slower.
#pragma once

#include <cstdint>
#include <memory>

#include "client/staging_allocator.h"
#include "core/log.h"
#include "transport/transport.h"

namespace tessera::client {

class GatherBuffer {
 public:
  // Enough for several pushes in flight to one shard; allocated on first use.
  static constexpr uint64_t kBytes = 4u << 20;
  // The most one gathered put carries.
  static constexpr uint64_t kMaxRunBytes = 1u << 20;

  // `bytes` of the buffer, or null while it is full (or when the fabric
  // could not allocate it: the chunks then go one put each).
  uint8_t* Take(transport::Context& ctx, uint64_t bytes) {
    if (region_ == nullptr && !unavailable_) {
      auto region =
          ctx.Allocate(kBytes, transport::MemoryKind::kHost, transport::RemoteAccess::kRead);
      if (!region.ok()) {
        unavailable_ = true;
        TLOG_WARN("small chunks go one put each: no gather buffer ({})",
                  region.status().ToString());
        return nullptr;
      }
      region_ = std::move(*region);
      alloc_.Reset(kBytes);
    }
    if (region_ == nullptr) return nullptr;
    auto offset = alloc_.Allocate(bytes);
    if (!offset) return nullptr;
    return static_cast<uint8_t*>(region_->data()) + *offset;
  }
  // Hands back what Take returned, once the put from it completed.
  void Give(const uint8_t* p) {
    if (region_ != nullptr)
      alloc_.Free(static_cast<uint64_t>(p - static_cast<uint8_t*>(region_->data())));
  }
  // The region goes before the fabric's context does.
  void Release() { region_.reset(); }

 private:
  std::unique_ptr<transport::Region> region_;
  StagingAllocator alloc_;
  bool unavailable_ = false;
};

}  // namespace tessera::client
