// A link's regions: the arenas a create's reply lends, and letting go of
// what the shard lent.

#include "client/shard_link.h"

#include "core/log.h"

namespace tessera::client {

Status ShardLink::TakeCreated(const wire::CreateReply& reply, const std::vector<Chunk*>& chunks,
                              int cuda_device) {
  if (reply.keys.size() != chunks.size()) {
    return Status::Internal("create reply does not match the request");
  }
  if (!ep) return dead.ok() ? Status::Unavailable(name() + " is not connected") : dead;
  for (const auto& a : reply.arenas) {
    auto region = ep->Attach(a.region);
    if (!region.ok()) return region.status();
    arenas[a.arena_id] = std::move(*region);
    MapArena(a, cuda_device);
  }
  for (size_t k = 0; k < chunks.size(); ++k) {
    const wire::KeyLocation& key = reply.keys[k];
    if (key.byte_length != chunks[k]->bytes) {
      return Status::Internal("shard holds a chunk of another size");
    }
    chunks[k]->key_id = key.key_id;
    chunks[k]->arena_id = key.arena_id;
    chunks[k]->arena_offset = key.arena_offset;
  }
  return Status::Ok();
}

void ShardLink::MapArena(const wire::ArenaKey& a, int cuda_device) {
  if (a.ipc.empty() || ipc.slot.data() == nullptr) return;
  auto m = gpu::IpcMapping::Open(a.ipc.data(), a.ipc.size(), cuda_device);
  if (!m.ok()) {
    TLOG_WARN("{}: arena {} not mapped with CUDA IPC ({}): pulls use the fabric", name(),
              a.arena_id, m.status().message());
    return;
  }
  ipc.arenas[a.arena_id] = std::move(*m);
}

void ShardLink::DropRegions(CallCounters& counts) {
  staging.reset();
  arenas.clear();
  if (ipc.slot.data() != nullptr) counts.ipc_shards--;
  ipc.slot = gpu::IpcMapping{};
  ipc.arenas.clear();
}

}  // namespace tessera::client
