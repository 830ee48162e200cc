// The CUDA IPC route, for push and pull alike: a GPU shard on this node
// maps its staging slot for this worker and its arenas here, so that a push
// is device copies into the slot and a pull device copies out of the
// arenas, on the client's stream, waited for once. Loop thread.
#pragma once

#include <span>

#include "client/call_counters.h"
#include "client/chunk_io.h"
#include "client/gpu_access.h"
#include "client/shard_link.h"
#include "wire/messages.h"

namespace tessera::client {

class IpcRoute {
 public:
  IpcRoute(GpuAccess& gpu, CallCounters& counts) : gpu_(gpu), counts_(counts) {}

  // Whether the shard's slot is mapped here (a push goes this way).
  static bool SlotMapped(const ShardLink& link) { return link.ipc.slot.data() != nullptr; }
  // Whether every chunk's arena is mapped here (a pull goes this way).
  static bool ArenasMapped(const ShardLink& link, const ChunkIos& ios);

  // Push: chunk i into the slot at `at[i]`'s staging offset.
  Status IntoSlot(const ShardLink& link, const ChunkIos& ios, std::span<const wire::PushEntry> at);
  // Pull: the chunks out of their mapped arenas.
  Status FromArenas(const ShardLink& link, const ChunkIos& ios);

 private:
  // Waits for the copies issued (`issued`: the first error among them),
  // counts their bytes, and names what failed.
  Status Finish(const Status& issued, uint64_t bytes, const std::string& what);

  GpuAccess& gpu_;
  CallCounters& counts_;
};

}  // namespace tessera::client
