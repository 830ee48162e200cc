// A registered buffer that small chunks travel through side by side, as they
// lie at the peer, so that they cost one transfer instead of one each: a
// push copies its chunks bound for a shard's staging slot in and puts them
// once; a pull gets a run of chunks that lie next to each other in the
// shard's arena once and copies them out. Per put or get, a fabric may pay
// a frame, a completion and (verbs, for memory it does not know) a
// registration; for a 4 KiB chunk that can cost far more than copying it.
// Which chunks are small enough is the fabric's to say
// (Endpoint::GatherUpTo): over UCX's shared memory a put is itself one
// copy, and gathering first made it slower.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include "client/staging_allocator.h"
#include "core/log.h"
#include "transport/transport.h"

namespace tessera::client {

// Where a chunk lies at the peer, as a run sees it.
struct PeerSpan {
  uint64_t offset, bytes;
};

// A run of chunks one gathered transfer can carry, from `first` up to `end`
// (exclusive), spanning `span` bytes at the peer.
struct GatherRun {
  size_t end;
  uint64_t span;
};

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
  // The run that starts at chunk `first` of `n`: each chunk at most
  // `up_to` bytes, each starting at or after the previous one's end and at
  // most `up_to` bytes past it (the bytes between are read or written for
  // nothing: alignment padding, or a tensor the call left out), the whole
  // within kMaxRunBytes. `at(i)` says where chunk i lies, or nullopt where
  // it cannot join `first`'s run (GPU memory, another arena). A run of one
  // is worth no copy: the caller moves it as it is.
  template <typename At>
  static GatherRun RunFrom(size_t first, size_t n, uint64_t up_to, const At& at) {
    if (up_to == 0) return {first + 1, 0};
    const std::optional<PeerSpan> head = at(first);
    if (!head || head->bytes > up_to) return {first + 1, 0};
    uint64_t end_at = head->offset + head->bytes;
    size_t end = first + 1;
    for (; end < n; ++end) {
      const std::optional<PeerSpan> next = at(end);
      if (!next || next->bytes > up_to || next->offset < end_at || next->offset - end_at > up_to ||
          next->offset + next->bytes - head->offset > kMaxRunBytes) {
        break;
      }
      end_at = next->offset + next->bytes;
    }
    return {end, end_at - head->offset};
  }

  // The region goes before the fabric's context does.
  void Release() { region_.reset(); }

 private:
  std::unique_ptr<transport::Region> region_;
  StagingAllocator alloc_;
  bool unavailable_ = false;
};

}  // namespace tessera::client
