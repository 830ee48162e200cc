#include "client/ipc_route.h"

namespace tessera::client {

bool IpcRoute::ArenasMapped(const ShardLink& link, const ChunkIos& ios) {
  bool all = !ios.empty();
  for (const auto& io : ios) all &= link.ipc.arenas.count(io.chunk->arena_id) > 0;
  return all;
}

Status IpcRoute::IntoSlot(const ShardLink& link, const ChunkIos& ios,
                          std::span<const wire::PushEntry> at) {
  Status issued;
  uint64_t bytes = 0;
  for (size_t i = 0; i < ios.size() && issued.ok(); ++i) {
    issued = gpu_.CopyAsync(link.ipc.slot.data() + at[i].staging_offset, ios[i].local,
                            ios[i].chunk->bytes);
    bytes += ios[i].chunk->bytes;
  }
  return Finish(issued, bytes, "copying into the CUDA IPC slot of " + link.name());
}

Status IpcRoute::FromArenas(const ShardLink& link, const ChunkIos& ios) {
  Status issued;
  uint64_t bytes = 0;
  for (size_t i = 0; i < ios.size() && issued.ok(); ++i) {
    const Chunk* c = ios[i].chunk;
    const uint8_t* src = link.ipc.arenas.at(c->arena_id).data() + c->arena_offset;
    issued = gpu_.CopyAsync(ios[i].local, src, c->bytes);
    bytes += c->bytes;
  }
  return Finish(issued, bytes, "copying from the CUDA IPC mapping of " + link.name());
}

// Waits even after a failed issue: the copies already issued read or write
// the caller's buffers, which the caller may reuse once told.
Status IpcRoute::Finish(const Status& issued, uint64_t bytes, const std::string& what) {
  Status waited = gpu_.Wait();
  Status st = issued.ok() ? waited : issued;
  if (st.ok()) counts_.ipc_bytes += bytes;
  return st.WithContext(what);
}

}  // namespace tessera::client
