// One link of a client to a shard (a ps task, or the coordinator where it
// runs apart): its connection, how joining it goes, the regions the shard
// lent it (its staging slot, its arenas, their CUDA IPC mappings), and the
// work in flight on it. Plain state shared by the units that use a link
// (ShardLinks, ShardJoiner, PushSender, PullReceiver); loop thread, except
// `task` and `addr`, fixed at the start.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "client/call_counters.h"
#include "client/gather_buffer.h"
#include "client/silence_meter.h"
#include "client/staging_allocator.h"
#include "client/tensor_table.h"
#include "core/inline_function.h"
#include "core/pool_allocator.h"
#include "gpu/cuda.h"
#include "tessera/cluster.h"
#include "transport/transport.h"
#include "wire/messages.h"

namespace tessera::client {

struct ShardLink {
  // Joining the shard, at the start and after it was lost.
  struct Joining {
    int attempts = 0;           // turned away or unanswered so far
    uint64_t request = 0;       // the handshake's request waiting, if any
    bool reconnecting = false;  // a restarted shard is being joined again
    std::chrono::steady_clock::time_point next_reconnect;
  };
  // A GPU shard on this node: its slot for this worker and its arenas,
  // mapped with CUDA IPC (pushes and pulls are device copies then).
  struct IpcMaps {
    gpu::IpcMapping slot;
    std::unordered_map<uint32_t, gpu::IpcMapping> arenas;
  };
  // One-sided work in flight, failed when the shard is lost: a fabric may
  // never complete operations towards a peer that hangs. An entry per large
  // call: its node from the pool, its abort held in place.
  struct InFlight {
    using Abort = InlineFunction<void(const Status&), 160>;
    std::unordered_map<uint64_t, Abort, std::hash<uint64_t>, std::equal_to<>,
                       PoolAllocator<std::pair<const uint64_t, Abort>>>
        ops;
    uint64_t next_id = 1;
  };

  TaskId task;
  TaskAddress addr;
  std::shared_ptr<transport::Endpoint> ep;
  Joining joining;
  std::unique_ptr<transport::RemoteRegion> staging;
  StagingAllocator alloc;
  // Where small chunks are gathered into one put (gather_buffer.h).
  GatherBuffer gather;
  std::unordered_map<uint32_t, std::unique_ptr<transport::RemoteRegion>> arenas;
  IpcMaps ipc;
  std::deque<std::function<void()>> waiting_for_staging;
  Status dead;  // non-OK once the connection is gone
  // Listening time without any traffic from the shard (heartbeats).
  SilenceMeter silence;
  InFlight in_flight;

  std::string name() const { return task.ToString() + " (" + addr.ToString() + ")"; }
  // What a failed one-sided operation on the shard reports: why the shard
  // was lost if it was, else the fabric's error naming the shard.
  Status Error(const Status& st) const { return dead.ok() ? st.WithContext(name()) : dead; }
  // A create's reply for `chunks` (in the order the create listed them):
  // the arenas it names attached (and mapped with CUDA IPC where the shard
  // shares this node), each chunk's key and place in its arena taken.
  Status TakeCreated(const wire::CreateReply& reply, const std::vector<Chunk*>& chunks,
                     int cuda_device);
  // The regions the shard lent this connection, let go: its staging slot,
  // arenas and mappings (the connection is gone, or the client closes).
  void DropRegions(CallCounters& counts);

 private:
  void MapArena(const wire::ArenaKey& a, int cuda_device);
};

}  // namespace tessera::client
