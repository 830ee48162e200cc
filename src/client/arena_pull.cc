// One pull's chunks read out of a shard's arenas under the lease its reply
// granted. They take one route: copied from the CUDA IPC mapping of the
// arenas (same node, GPU shard: ipc_route.h), or got one-sided
// (one_sided_moves.h), GPU chunks read into host memory first where the
// fabric cannot reach GPU memory (host_bounce.h).

#include <cstring>

#include "client/arena_pull.h"
#include "client/one_sided_moves.h"

namespace tessera::client {

void PullReceiver::ArenaPull::Start(PullReceiver* receiver, int shard, ChunkIos ios, uint64_t lease,
                                    const PartDone& done) {
  ShardLink& s = receiver->links_[shard];
  auto pull = std::allocate_shared<ArenaPull>(PoolAllocator<ArenaPull>());
  pull->receiver = receiver;
  pull->outstanding = static_cast<int>(ios.size());
  pull->shard = shard;
  pull->op_id = s.in_flight.next_id++;
  pull->lease = lease;
  pull->done = done;
  pull->ios = std::move(ios);
  s.in_flight.ops[pull->op_id] = [pull](const Status& why) { pull->Finish(why); };
  if (IpcRoute::ArenasMapped(s, pull->ios)) {
    Status copied = receiver->ipc_.FromArenas(s, pull->ios);
    pull->Release();
    return pull->Finish(copied);
  }
  if (!receiver->gpu_.fabric_reaches()) pull->bounce.Redirect(pull->ios);
  pull->Get(pull);
}

// The gets (one_sided_moves.h); a gathered run's bytes are copied out as
// it completes (Read).
void PullReceiver::ArenaPull::Get(const Ptr& self) {
  ShardLink& s = receiver->links_[shard];
  // Consecutive chunks mostly share an arena: its key is looked up once.
  uint32_t last_id = 0;
  const transport::RemoteRegion* last = nullptr;
  auto at = [&](size_t i) {
    const Chunk* c = ios[i].chunk;
    if (last == nullptr || c->arena_id != last_id) {
      auto arena = s.arenas.find(c->arena_id);
      last_id = c->arena_id;
      last = arena == s.arenas.end() ? nullptr : arena->second.get();
    }
    return OneSidedChunk{ios[i].local, c->bytes, last, c->arena_offset, ios[i].on_gpu};
  };
  ForEachOneSidedMove(
      s, receiver->ctx_, ios.size(), at,
      [&](size_t first, size_t end, uint8_t* buffer, uint64_t span,
          const transport::RemoteRegion& region, uint64_t addr) {
        s.ep->Get(buffer, span, region, addr,
                  [self, first = static_cast<uint32_t>(first), end = static_cast<uint32_t>(end),
                   buffer](const Status& st) { self->Read(st, first, end, buffer); });
      },
      [&](size_t first, std::span<const transport::RmaPiece> pieces,
          const transport::RemoteRegion& region) {
        const auto end = static_cast<uint32_t>(first + pieces.size());
        s.ep->GetMany(pieces, region,
                      [self, first = static_cast<uint32_t>(first), end](const Status& st) {
                        self->Read(st, first, end, nullptr);
                      });
      },
      [&](size_t i) {
        const auto k = static_cast<uint32_t>(i);
        Read(Status::Internal("no key for arena " + std::to_string(ios[i].chunk->arena_id) +
                              " of " + s.name()),
             k, k + 1, nullptr);
      });
}

// Chunks [first, end) are read: from `gathered`, when they came in one get
// through the gather buffer, copied out to where each belongs (unless the
// pull already ended: the shard was lost, and the caller's memory may be
// gone) and the buffer given back. The last chunk read ends the pull.
void PullReceiver::ArenaPull::Read(const Status& st, uint32_t first, uint32_t end,
                                   const uint8_t* gathered) {
  if (gathered != nullptr) {
    if (st.ok() && !finished) {
      const uint64_t base = ios[first].chunk->arena_offset;
      for (uint32_t i = first; i < end; ++i) {
        const Chunk* c = ios[i].chunk;
        std::memcpy(ios[i].local, gathered + (c->arena_offset - base), c->bytes);
      }
    }
    receiver->links_[shard].gather.Give(gathered);
  }
  if (!st.ok() && status.ok()) status = st;
  outstanding -= static_cast<int>(end - first);
  if (outstanding > 0) return;
  if (status.ok()) status = bounce.Up(receiver->gpu_, receiver->counts_);
  Release();
  Finish(status.ok() ? status : receiver->links_[shard].Error(status));
}

}  // namespace tessera::client
