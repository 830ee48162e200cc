// Receives one shard's part of a pull: asks for the chunks, and lands the
// reply's bytes in the caller's buffers, copied from the reply when they
// came inline (inline_route.h), else read out of the shard's arenas under
// the lease it granted (arena_pull.cc). push_pull's inline round trip ends
// here too: the shard answers that push with the weights it produced. Loop
// thread.
#pragma once

#include <chrono>
#include <cstdint>

#include "client/call_counters.h"
#include "client/chunk_io.h"
#include "client/gpu_access.h"
#include "client/inline_route.h"
#include "client/ipc_route.h"
#include "client/shard_links.h"
#include "transport/transport.h"
#include "wire/messages.h"

namespace tessera::client {

class PullReceiver {
 public:
  // `inline_bytes`: the most a reply may carry inline; `op_timeout`: how
  // long a call waits (a shard holding a pull answers a little before).
  PullReceiver(ShardLinks& links, GpuAccess& gpu, CallCounters& counts, transport::Context& ctx,
               uint64_t inline_bytes, std::chrono::milliseconds op_timeout);

  void Pull(int shard, ChunkIos ios, const PartDone& done);
  // Sends `push` (its gradients inline) asking for the weights it produces
  // in the same reply, landed in `weights`.
  void PushThenPull(int shard, const wire::Push& push, ChunkIos weights, PartDone done);

 private:
  struct ArenaPull;
  // Whether `shard` may be sent a call now; else `done` hears why not.
  bool Reachable(int shard, const PartDone& done);
  // The handler of a reply carrying a pull's answer: decoded, then Accept.
  ReplyFn OnReply(int shard, ChunkIos ios, PartDone done);
  void Accept(int shard, ChunkIos ios, const wire::PullReply& reply, const PartDone& done);

  ShardLinks& links_;
  GpuAccess& gpu_;
  CallCounters& counts_;
  transport::Context& ctx_;
  const uint32_t inline_max_;
  const uint32_t wait_ms_;  // how long a shard may hold a pull
  InlineRoute inline_;
  IpcRoute ipc_;
  // The last pull built and the last reply decoded: each used up before
  // the next is made, so reusing them saves their allocations.
  wire::Pull scratch_;
  wire::PullReply reply_scratch_;
};

}  // namespace tessera::client
