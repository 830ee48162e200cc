// One pull's chunks read out of a shard's arenas under the lease its reply
// granted. They take one route: copied from the CUDA IPC mapping of the
// arenas (same node, GPU shard), or got one-sided, GPU chunks read into host
// memory first where the fabric cannot reach GPU memory.

#include <cstring>

#include "client/arena_pull.h"

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
  if (pull->AllMapped()) return pull->FromIpcArenas();
  std::vector<uint8_t*> into;  // where each get lands, when some go through host memory
  if (!receiver->gpu_.fabric_reaches()) into = pull->PlanHostBounce();
  pull->Get(pull, into);
}

bool PullReceiver::ArenaPull::AllMapped() const {
  const ShardLink& s = receiver->links_[shard];
  bool all = !ios.empty();
  for (const auto& io : ios) all &= s.ipc.arenas.count(io.chunk->arena_id) > 0;
  return all;
}

// Same node, GPU shard: device copies out of the mapped arenas.
void PullReceiver::ArenaPull::FromIpcArenas() {
  ShardLink& s = receiver->links_[shard];
  Status copied;
  uint64_t bytes = 0;
  for (const auto& io : ios) {
    const uint8_t* src = s.ipc.arenas.at(io.chunk->arena_id).data() + io.chunk->arena_offset;
    if (copied.ok()) copied = receiver->gpu_.CopyAsync(io.local, src, io.chunk->bytes);
    bytes += io.chunk->bytes;
  }
  if (copied.ok()) copied = receiver->gpu_.Wait();
  receiver->counts_.ipc_bytes += copied.ok() ? bytes : 0;
  Release();
  Finish(copied.WithContext("copying from the CUDA IPC mapping of " + s.name()));
}

// GPU chunks on a fabric that cannot reach GPU memory are read into host
// memory and copied up once the gets are done: where each chunk's get lands
// (empty: each where it belongs).
std::vector<uint8_t*> PullReceiver::ArenaPull::PlanHostBounce() {
  std::vector<uint8_t*> into;
  uint64_t need = 0;
  for (const auto& io : ios) need += io.on_gpu ? io.chunk->bytes : 0;
  if (need == 0) return into;
  bounce.resize(need);
  uint64_t at = 0;
  for (const auto& io : ios) {
    into.push_back(io.on_gpu ? bounce.data() + at : io.local);
    if (!io.on_gpu) continue;
    bounce_to.emplace_back(io.local, io.chunk->bytes);
    at += io.chunk->bytes;
  }
  return into;
}

// Issues the gets: a run of small host chunks that lie next to each other
// in one arena comes in one get through the gather buffer (the bytes
// between them, padding or tensors this pull left out, are read and
// dropped); the others as they are, in batches from one arena (Endpoint::
// GetMany: a fabric that copies them itself copies them back to back).
void PullReceiver::ArenaPull::Get(const Ptr& self, const std::vector<uint8_t*>& into) {
  ShardLink& s = receiver->links_[shard];
  const uint64_t gather_up_to = s.ep->GatherUpTo();
  // Chunks [batch_first, batch_first + batch.size()), issued when the next
  // chunk cannot join it, and at the end.
  std::vector<transport::RmaPiece, PoolAllocator<transport::RmaPiece>> batch;
  batch.reserve(ios.size());
  uint32_t batch_first = 0;
  const transport::RemoteRegion* batch_arena = nullptr;
  auto issue_batch = [&] {
    if (batch.empty()) return;
    const auto end = static_cast<uint32_t>(batch_first + batch.size());
    s.ep->GetMany(batch, *batch_arena, [self, first = batch_first, end](const Status& st) {
      self->Read(st, first, end, nullptr);
    });
    batch.clear();
  };
  for (size_t k = 0; k < ios.size();) {
    const auto first = static_cast<uint32_t>(k);
    const Chunk* chunk = ios[k].chunk;
    auto arena = s.arenas.find(chunk->arena_id);
    if (arena == s.arenas.end() || arena->second.get() != batch_arena) issue_batch();
    if (arena == s.arenas.end()) {
      Read(Status::Internal("no key for arena " + std::to_string(chunk->arena_id) + " of " +
                            s.name()),
           first, first + 1, nullptr);
      ++k;
      continue;
    }
    const uint64_t at = arena->second->base() + chunk->arena_offset;
    const auto run = client::GatherBuffer::RunFrom(
        k, ios.size(), gather_up_to, [&](size_t i) -> std::optional<client::PeerSpan> {
          const Chunk* c = ios[i].chunk;
          if (ios[i].on_gpu || c->arena_id != chunk->arena_id) return std::nullopt;
          return client::PeerSpan{c->arena_offset, c->bytes};
        });
    uint8_t* gathered = run.end - k >= 2 ? s.gather.Take(receiver->ctx_, run.span) : nullptr;
    if (gathered == nullptr) {
      if (batch.empty()) {
        batch_first = first;
        batch_arena = arena->second.get();
      }
      batch.push_back({into.empty() ? ios[k].local : into[k], chunk->bytes, at});
      ++k;
      continue;
    }
    issue_batch();
    const auto end = static_cast<uint32_t>(run.end);
    s.ep->Get(
        gathered, run.span, *arena->second, at,
        [self, first, end, gathered](const Status& st) { self->Read(st, first, end, gathered); });
    k = run.end;
  }
  issue_batch();
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
  if (!bounce.empty() && status.ok()) status = CopyUp();
  Release();
  Finish(status.ok() ? status : receiver->links_[shard].Error(status));
}

// The GPU chunks read into host memory, up to where they belong.
Status PullReceiver::ArenaPull::CopyUp() {
  const uint8_t* src = bounce.data();
  Status up;
  for (const auto& [dst, n] : bounce_to) {
    if (up.ok()) up = receiver->gpu_.CopyAsync(dst, src, n);
    src += n;
  }
  if (up.ok()) up = receiver->gpu_.Wait();
  if (up.ok()) receiver->counts_.staged_bytes += bounce.size();
  return up.WithContext("staging into GPU memory through host memory");
}

}  // namespace tessera::client
