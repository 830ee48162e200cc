// The one-sided route, for push and pull alike: a push's chunks are put
// into the shard's staging slot, a pull's got out of its arenas. Both move
// their chunks the same way: a run of small host chunks that lie side by
// side at the shard travels as one operation through the link's gather
// buffer (gather_buffer.h), the other chunks as they are, consecutive ones
// of one region in one batch (Endpoint::PutMany, GetMany: a fabric that
// copies them itself copies them back to back). Loop thread.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <vector>

#include "client/gather_buffer.h"
#include "client/shard_link.h"
#include "core/pool_allocator.h"
#include "transport/transport.h"

namespace tessera::client {

// Chunk i of a call, as its one-sided moves see it.
struct OneSidedChunk {
  uint8_t* local;  // read by a put, written by a get
  uint64_t bytes;
  const transport::RemoteRegion* region;  // null: the shard lent no key for it
  uint64_t offset;                        // in `region`, from its base
  bool on_gpu;                            // never gathered (the buffer is host memory)
};

// Visits chunks [0, n) (`at(i)`: chunk i) as the operations that move
// them, in order:
//  - `gathered(first, end, buffer, span, region, remote_addr)`: chunks
//    [first, end), at least two, carried by one operation through `buffer`
//    (`span` bytes of the gather buffer, which the operation's completion
//    gives back);
//  - `batch(first, pieces, region)`: chunks [first, first + pieces.size())
//    of one region, each as it is;
//  - `missing(i)`: chunk i, whose region the shard never lent.
template <typename ChunkAt, typename Gathered, typename Batch, typename Missing>
void ForEachOneSidedMove(ShardLink& link, transport::Context& ctx, size_t n, const ChunkAt& at,
                         const Gathered& gathered, const Batch& batch, const Missing& missing) {
  const uint64_t gather_up_to = link.ep->GatherUpTo();
  std::vector<transport::RmaPiece, PoolAllocator<transport::RmaPiece>> pieces;
  pieces.reserve(n);
  size_t pieces_first = 0;
  const transport::RemoteRegion* pieces_region = nullptr;
  auto issue_pieces = [&] {
    if (pieces.empty()) return;
    batch(pieces_first, std::span<const transport::RmaPiece>(pieces), *pieces_region);
    pieces.clear();
  };
  for (size_t k = 0; k < n;) {
    const OneSidedChunk head = at(k);
    if (head.region != pieces_region) issue_pieces();
    if (head.region == nullptr) {
      missing(k++);
      continue;
    }
    const auto run =
        GatherBuffer::RunFrom(k, n, gather_up_to, [&](size_t i) -> std::optional<PeerSpan> {
          const OneSidedChunk c = i == k ? head : at(i);
          if (c.on_gpu || c.region != head.region) return std::nullopt;
          return PeerSpan{c.offset, c.bytes};
        });
    uint8_t* buffer = run.end - k >= 2 ? link.gather.Take(ctx, run.span) : nullptr;
    if (buffer == nullptr) {
      if (pieces.empty()) {
        pieces_first = k;
        pieces_region = head.region;
      }
      pieces.push_back({head.local, head.bytes, head.region->base() + head.offset});
      ++k;
      continue;
    }
    issue_pieces();
    gathered(k, run.end, buffer, run.span, *head.region, head.region->base() + head.offset);
    k = run.end;
  }
  issue_pieces();
}

// A put's run: chunks [first, end) copied into `buffer` as they lie at the
// shard, relative to the first.
template <typename ChunkAt>
void CopyRunIn(uint8_t* buffer, const ChunkAt& at, size_t first, size_t end) {
  const uint64_t base = at(first).offset;
  for (size_t i = first; i < end; ++i) {
    const OneSidedChunk c = at(i);
    std::memcpy(buffer + (c.offset - base), c.local, c.bytes);
  }
}

}  // namespace tessera::client
